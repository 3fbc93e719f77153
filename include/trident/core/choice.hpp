// trident/core/choice.hpp — a key that names one of a few words, parsed once into its enum
// (Choice<E>), and what the deck loader sees of any such key (ChoiceKey). Core, so that every
// module may hold one (model::ModelConfig::arch, train::Layout's modes).
// Each enum's words are one choice_words(E) overload in the enum's own namespace, where
// Choice finds them (argument-dependent lookup), in FORMAT.md's order; a choice_key(E)
// overload there names the key, for the error a word not among them gets.
// defines: trident::ChoiceWords, ChoiceKey, Choice, choice_key
#pragma once

#include <cstddef>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "trident/core/error.hpp"

namespace trident {

template <class E>
using ChoiceWords = std::vector<std::pair<E, const char*>>;

// The key a Choice<E> is read from; none unless the enum's namespace names one.
template <class E>
const char* choice_key(E) {
  return nullptr;
}

// What the deck loader sees of any Choice<E> (and train::ScheduleChoice): its words.
class ChoiceKey {
 public:
  virtual ~ChoiceKey() = default;
  virtual std::vector<std::string> choices() const = 0;
  virtual std::string current() const = 0;
  virtual void choose(const std::string& word) = 0;  // one of choices()
};

// A key that names one of a few choices: its word is parsed once, when the deck (or a file)
// is read (the deck loader refuses any other word, naming the key), and code uses the enum E
// (get(), or == E::x); the word comes back for files and messages (word(), <<).
template <class E>
class Choice : public ChoiceKey {
 public:
  Choice(E value) : value_(value) {}  // NOLINT: a default is written as its enum
  Choice(const std::string& word) : value_(parse(word)) {}  // NOLINT
  Choice(const char* word) : value_(parse(word)) {}         // NOLINT

  E get() const { return value_; }
  const char* word() const {
    for (const auto& [e, w] : choice_words(E{}))
      if (e == value_) return w;
    return "?";
  }
  static std::vector<std::string> words() {
    std::vector<std::string> out;
    for (const auto& [e, w] : choice_words(E{})) out.push_back(w);
    return out;
  }
  static std::optional<E> find(const std::string& word) {
    for (const auto& [e, w] : choice_words(E{}))
      if (word == w) return e;
    return std::nullopt;
  }

  std::vector<std::string> choices() const override { return words(); }
  std::string current() const override { return word(); }
  void choose(const std::string& word) override { value_ = parse(word); }

  bool operator==(const Choice& o) const { return value_ == o.value_; }
  bool operator!=(const Choice& o) const { return value_ != o.value_; }
  bool operator==(E e) const { return value_ == e; }
  bool operator!=(E e) const { return value_ != e; }
  // Against a word: for tests and tools that read decks as text, not for code paths.
  friend bool operator==(const Choice& c, const char* word) {
    return std::string(c.word()) == word;
  }
  friend std::ostream& operator<<(std::ostream& os, const Choice& c) { return os << c.word(); }

 private:
  // `key: expected "a" or "b", got "x"` where the enum names its key; else without it.
  static E parse(const std::string& word) {
    if (const std::optional<E> e = find(word)) return *e;
    const char* key = choice_key(E{});
    if (!key) fail("'", word, "' is not one of the expected words");
    const ChoiceWords<E>& w = choice_words(E{});
    std::string list;
    for (std::size_t i = 0; i < w.size(); ++i)
      list += str(i ? (i + 1 == w.size() ? " or " : ", ") : "", "\"", w[i].second, "\"");
    fail(key, ": expected ", list, ", got \"", word, "\"");
  }
  E value_;
};

}  // namespace trident
