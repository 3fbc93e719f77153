// trident's entry point (skeleton; subcommands come next).
int main() { return 0; }
