// trident/core/error.hpp — the one error type, and helpers that build its message.
// defines: trident::Error, trident::fail, TRIDENT_CHECK, trident::str
//
// Every user-facing failure is an Error whose what() is a single line naming the key or
// file and what was expected; app/main prints it as "trident: error: <what>".
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace trident {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// str(a, b, c): concatenates anything streamable into one string.
template <typename... Args>
std::string str(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(str(std::forward<Args>(args)...));
}

}  // namespace trident

// TRIDENT_CHECK(cond, parts...): throws Error(parts...) when cond is false.
#define TRIDENT_CHECK(cond, ...)              \
  do {                                        \
    if (!(cond)) ::trident::fail(__VA_ARGS__); \
  } while (0)
