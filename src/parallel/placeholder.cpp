// placeholder so the module library has a source; replaced as the module is written.
