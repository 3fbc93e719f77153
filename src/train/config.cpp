// The input deck: a table of every key (FORMAT.md's order), TOML in through toml++, overrides,
// validation with one-line messages, and the resolved deck back out as TOML.
// defines: trident::train::load_config, parse_config, to_toml, resolve_world,
//          microbatches_per_rank, Config::operator== (from the key table)
//
// How a deck is read: parse the text (syntax errors carry line:column) -> assign each key
// through the key table, checking its TOML type -> apply the `--set` overrides through the
// same table -> validate ranges, enums and divisibility. Every key remembers where it was
// set ("deck.toml:4:1", "deck.toml (--set)") so that a later check points at the right place.
#include "trident/train/config.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <type_traits>
#include <variant>

#include "trident/core/error.hpp"
#include "trident/model/gpt.hpp"
#include "trident/model/spec.hpp"
#include "trident/model/stage_model.hpp"
#include "trident/pipeline/schedule.hpp"
#include "trident/parallel/tp_grid2d.hpp"
#include "trident/train/data_loader.hpp"

namespace trident::train {

namespace {

// ---------------------------------------------------------------------------------------
// The key table: one row per deck key, in FORMAT.md's order.

// ChoiceKey*: a key whose value is one of a few words (Choice<E>).
using Field = std::variant<int*, std::int64_t*, double*, bool*, std::string*, ChoiceKey*>;

struct KeyDef {
  const char* section;
  const char* name;
  std::function<Field(Config&)> field;
  std::string full() const { return std::string(section) + "." + name; }
};

// model.arch and the keys only a Llama deck may set.
const char* const kLlamaKeys[] = {"arch",     "n_kv_head", "ffn_hidden",    "ffn_multiple_of",
                                  "rope_theta", "norm_eps", "tie_embeddings"};

const std::vector<KeyDef>& key_table() {
  static const std::vector<KeyDef> keys = {
      {"model", "vocab_size", [](Config& c) -> Field { return &c.model.vocab_size; }},
      {"model", "seq_len", [](Config& c) -> Field { return &c.model.seq_len; }},
      {"model", "n_layer", [](Config& c) -> Field { return &c.model.n_layer; }},
      {"model", "n_head", [](Config& c) -> Field { return &c.model.n_head; }},
      {"model", "d_model", [](Config& c) -> Field { return &c.model.d_model; }},
      {"model", "arch", [](Config& c) -> Field { return &c.model.arch; }},
      {"model", "n_kv_head", [](Config& c) -> Field { return &c.model.n_kv_head; }},
      {"model", "ffn_hidden", [](Config& c) -> Field { return &c.model.ffn_hidden; }},
      {"model", "ffn_multiple_of", [](Config& c) -> Field { return &c.model.ffn_multiple_of; }},
      {"model", "rope_theta", [](Config& c) -> Field { return &c.model.rope_theta; }},
      {"model", "norm_eps", [](Config& c) -> Field { return &c.model.norm_eps; }},
      {"model", "tie_embeddings", [](Config& c) -> Field { return &c.model.tie_embeddings; }},

      {"parallel", "tp", [](Config& c) -> Field { return &c.parallel.tp; }},
      {"parallel", "pp", [](Config& c) -> Field { return &c.parallel.pp; }},
      {"parallel", "dp", [](Config& c) -> Field { return &c.parallel.dp; }},
      {"parallel", "cp", [](Config& c) -> Field { return &c.parallel.cp; }},
      {"parallel", "cp_mode", [](Config& c) -> Field { return &c.parallel.cp_mode; }},
      {"parallel", "vpp", [](Config& c) -> Field { return &c.parallel.vpp; }},
      {"parallel", "schedule", [](Config& c) -> Field { return &c.parallel.schedule; }},
      {"parallel", "pipeline_layers",
       [](Config& c) -> Field { return &c.parallel.pipeline_layers; }},
      {"parallel", "micro_batch_size",
       [](Config& c) -> Field { return &c.parallel.micro_batch_size; }},
      {"parallel", "sequence_parallel",
       [](Config& c) -> Field { return &c.parallel.sequence_parallel; }},
      {"parallel", "tp_mode", [](Config& c) -> Field { return &c.parallel.tp_mode; }},
      {"parallel", "zero_stage", [](Config& c) -> Field { return &c.parallel.zero_stage; }},
      {"parallel", "grad_bucket_mb",
       [](Config& c) -> Field { return &c.parallel.grad_bucket_mb; }},
      {"parallel", "recompute", [](Config& c) -> Field { return &c.parallel.recompute; }},
      {"parallel", "layout", [](Config& c) -> Field { return &c.parallel.layout; }},
      {"parallel", "machine", [](Config& c) -> Field { return &c.parallel.machine; }},

      {"train", "steps", [](Config& c) -> Field { return &c.train.steps; }},
      {"train", "global_batch_size",
       [](Config& c) -> Field { return &c.train.global_batch_size; }},
      {"train", "lr", [](Config& c) -> Field { return &c.train.lr; }},
      {"train", "min_lr", [](Config& c) -> Field { return &c.train.min_lr; }},
      {"train", "warmup_steps", [](Config& c) -> Field { return &c.train.warmup_steps; }},
      {"train", "weight_decay", [](Config& c) -> Field { return &c.train.weight_decay; }},
      {"train", "beta1", [](Config& c) -> Field { return &c.train.beta1; }},
      {"train", "beta2", [](Config& c) -> Field { return &c.train.beta2; }},
      {"train", "eps", [](Config& c) -> Field { return &c.train.eps; }},
      {"train", "grad_clip", [](Config& c) -> Field { return &c.train.grad_clip; }},
      {"train", "seed", [](Config& c) -> Field { return &c.train.seed; }},
      {"train", "eval_every", [](Config& c) -> Field { return &c.train.eval_every; }},
      {"train", "eval_batches", [](Config& c) -> Field { return &c.train.eval_batches; }},
      {"train", "on_nonfinite", [](Config& c) -> Field { return &c.train.on_nonfinite; }},

      {"data", "train", [](Config& c) -> Field { return &c.data.train; }},
      {"data", "valid", [](Config& c) -> Field { return &c.data.valid; }},

      {"io", "out_dir", [](Config& c) -> Field { return &c.io.out_dir; }},
      {"io", "checkpoint_every", [](Config& c) -> Field { return &c.io.checkpoint_every; }},
      {"io", "final_checkpoint", [](Config& c) -> Field { return &c.io.final_checkpoint; }},
      {"io", "keep_checkpoints", [](Config& c) -> Field { return &c.io.keep_checkpoints; }},
      {"io", "resume", [](Config& c) -> Field { return &c.io.resume; }},
      {"io", "overwrite", [](Config& c) -> Field { return &c.io.overwrite; }},
      {"io", "init_weights", [](Config& c) -> Field { return &c.io.init_weights; }},
      {"io", "trace_step", [](Config& c) -> Field { return &c.io.trace_step; }},

      {"runtime", "device", [](Config& c) -> Field { return &c.runtime.device; }},
      {"runtime", "precision", [](Config& c) -> Field { return &c.runtime.precision; }},
      {"runtime", "threads", [](Config& c) -> Field { return &c.runtime.threads; }},
      {"runtime", "watchdog_s", [](Config& c) -> Field { return &c.runtime.watchdog_s; }},
      {"runtime", "cuda_graphs", [](Config& c) -> Field { return &c.runtime.cuda_graphs; }},
  };
  return keys;
}

const std::vector<std::string>& section_names() {
  static const std::vector<std::string> names = {"model", "parallel", "train",
                                                 "data",  "io",       "runtime"};
  return names;
}

// data.train and data.valid take a path or a list of {path, weight} (data_loader.hpp).
// Whether a schedule's backward passes are split into input (B) and weight (W) gradients
// (zero-bubble); one small instance of it tells.
bool splits_backward(const pipeline::ScheduleKind& schedule, int pp) {
  try {
    return pipeline::splits_weight_grad(pipeline::make_schedule(schedule, pp, 1, 2 * pp));
  } catch (const std::exception&) {
    return false;  // a schedule that cannot run at vpp = 1 is refused by its own rule
  }
}

bool is_data_list_key(const std::string& key) { return key == "data.train" || key == "data.valid"; }

// parallel.pipeline_layers as a list ("[1, 2, 2]"); false when it is a word.
bool parse_layer_list(const std::string& text, std::vector<int>& out) {
  if (text.rfind("[", 0) != 0) return false;
  std::vector<int> v;
  try {
    const toml::table t = toml::parse("v = " + text);
    const toml::array* a = t.get("v") ? t.get("v")->as_array() : nullptr;
    if (!a) return false;
    for (const toml::node& n : *a) {
      if (!n.is_integer()) return false;
      const std::int64_t x = n.as_integer()->get();
      if (x < INT_MIN || x > INT_MAX) return false;
      v.push_back(int(x));
    }
  } catch (const toml::parse_error&) {
    return false;
  }
  out = v;
  return true;
}

const KeyDef* find_key(const std::string& section, const std::string& name) {
  for (const KeyDef& k : key_table())
    if (section == k.section && name == k.name) return &k;
  return nullptr;
}

const KeyDef* find_key_full(const std::string& key) {
  const std::size_t dot = key.find('.');
  return find_key(key.substr(0, dot), key.substr(dot + 1));
}

// ---------------------------------------------------------------------------------------
// "Did you mean": optimal-string-alignment distance (a transposition costs 1).

std::size_t edit_distance(const std::string& a, const std::string& b) {
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::vector<std::size_t>> d(n + 1, std::vector<std::size_t>(m + 1));
  for (std::size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= n; ++i) {
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[n][m];
}

// Close enough to be a typo: at most 2 edits (1 for names of 4 characters or fewer).
bool is_close(const std::string& typed, const std::string& known, std::size_t dist) {
  const std::size_t limit = std::min(typed.size(), known.size()) <= 4 ? 1 : 2;
  return dist <= limit;
}

std::string suggest_key(const std::string& section, const std::string& name) {
  // The same name in another section ("train.tp" -> "parallel.tp") is the likeliest slip.
  for (const KeyDef& k : key_table())
    if (name == k.name) return str(" (did you mean '", k.full(), "'?)");
  const std::string typed = section + "." + name;
  std::string best;
  std::size_t best_d = SIZE_MAX;
  for (const KeyDef& k : key_table()) {
    // Compare within the section, and also the whole dotted name (catches section typos).
    const std::size_t d = std::min(section == k.section ? edit_distance(name, k.name) : SIZE_MAX,
                                   edit_distance(typed, k.full()));
    if (d < best_d) best_d = d, best = k.full();
  }
  if (!best.empty() && is_close(name, best.substr(best.find('.') + 1), best_d))
    return str(" (did you mean '", best, "'?)");
  return "";
}

std::string suggest_section(const std::string& section) {
  std::string best;
  std::size_t best_d = SIZE_MAX;
  for (const std::string& s : section_names()) {
    const std::size_t d = edit_distance(section, s);
    if (d < best_d) best_d = d, best = s;
  }
  if (is_close(section, best, best_d)) return str(" (did you mean '[", best, "]'?)");
  return "";
}

// ---------------------------------------------------------------------------------------
// Printing values (messages and to_toml).

std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

// The shortest decimal that reads back as exactly `v`, spelled as a TOML float.
std::string toml_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string field_value(const Field& f) {
  struct Visitor {
    std::string operator()(int* p) const { return std::to_string(*p); }
    std::string operator()(std::int64_t* p) const { return std::to_string(*p); }
    std::string operator()(double* p) const { return toml_float(*p); }
    std::string operator()(bool* p) const { return *p ? "true" : "false"; }
    std::string operator()(std::string* p) const { return toml_string(*p); }
    std::string operator()(ChoiceKey* c) const { return toml_string(c->current()); }
  };
  return std::visit(Visitor{}, f);
}

const char* expected_name(const Field& f) {
  struct Visitor {
    const char* operator()(int*) const { return "an integer"; }
    const char* operator()(std::int64_t*) const { return "an integer"; }
    const char* operator()(double*) const { return "a number"; }
    const char* operator()(bool*) const { return "a boolean (true or false)"; }
    const char* operator()(std::string*) const { return "a string"; }
    const char* operator()(ChoiceKey*) const { return "a string"; }
  };
  return std::visit(Visitor{}, f);
}

const char* toml_type_name(toml::node_type t) {
  switch (t) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    default: return "nothing";
  }
}

std::string at(const std::string& source, const toml::source_region& r) {
  if (r.begin.line == 0) return source;
  return str(source, ":", r.begin.line, ":", r.begin.column);
}

// ---------------------------------------------------------------------------------------
// Loading.

class Loader {
 public:
  explicit Loader(std::string source, bool allow_tp2d = false)
      : source_(std::move(source)), allow_tp2d_(allow_tp2d) {
    cfg_.source = source_;
  }

  void read_text(const std::string& text) {
    toml::table root;
    try {
      root = toml::parse(text, source_);
    } catch (const toml::parse_error& e) {
      // toml++ descriptions are one line; keep only the first in case that ever changes.
      std::string what(e.description());
      what = what.substr(0, what.find('\n'));
      fail(at(source_, e.source()), ": TOML syntax error: ", what);
    }

    // toml++ tables are sorted by name; report problems in the order of the file instead.
    struct Entry {
      toml::source_position pos;
      std::string section, name;
      const toml::key* key;
      const toml::node* node;
    };
    auto before = [](const Entry& a, const Entry& b) {
      return std::make_pair(a.pos.line, a.pos.column) < std::make_pair(b.pos.line, b.pos.column);
    };
    std::vector<Entry> sections;
    for (auto&& [key, node] : root)
      sections.push_back({key.source().begin, std::string(key.str()), "", &key, &node});
    std::sort(sections.begin(), sections.end(), before);

    for (const Entry& sec : sections) {
      const std::string where = at(source_, sec.key->source());
      const bool known = std::find(section_names().begin(), section_names().end(),
                                   sec.section) != section_names().end();
      if (!known) {
        if (!sec.node->is_table()) {  // a key outside any section
          std::string hint;
          for (const KeyDef& k : key_table())
            if (sec.section == k.name) { hint = str(" (did you mean '", k.full(), "'?)"); break; }
          fail(where, ": unknown key '", sec.section, "' outside any section", hint);
        }
        fail(where, ": unknown section '[", sec.section, "]'", suggest_section(sec.section));
      }
      if (!sec.node->is_table())
        fail(where, ": ", sec.section, ": expected a table (the section [", sec.section,
             "]), got ", toml_type_name(sec.node->type()));

      std::vector<Entry> keys;
      for (auto&& [key, node] : *sec.node->as_table())
        keys.push_back({key.source().begin, sec.section, std::string(key.str()), &key, &node});
      std::sort(keys.begin(), keys.end(), before);
      for (const Entry& e : keys) {
        const std::string kwhere = at(source_, e.key->source());
        const KeyDef* def = find_key(e.section, e.name);
        if (!def)
          fail(kwhere, ": unknown key '", e.section, ".", e.name, "'",
               suggest_key(e.section, e.name));
        assign(*def, *e.node, kwhere);
      }
    }
  }

  void apply_override(const std::string& ov) {
    const std::string where = source_ + " (--set)";
    const std::size_t eq = ov.find('=');
    const std::string key = trim(ov.substr(0, eq));
    const std::size_t dot = key.find('.');
    auto bare = [](const std::string& s) {
      return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
      });
    };
    if (eq == std::string::npos || dot == std::string::npos || !bare(key.substr(0, dot)) ||
        !bare(key.substr(dot + 1)))
      fail(where, ": --set expects section.key=value, got '", ov, "'");
    const std::string section = key.substr(0, dot), name = key.substr(dot + 1);
    const KeyDef* def = find_key(section, name);
    if (!def) {
      const bool known = std::find(section_names().begin(), section_names().end(), section) !=
                         section_names().end();
      if (!known && suggest_key(section, name).empty())
        fail(where, ": unknown section '[", section, "]' in --set ", key,
             suggest_section(section));
      fail(where, ": unknown key '", key, "'", suggest_key(section, name));
    }

    const std::string value = trim(ov.substr(eq + 1));
    Field f = def->field(cfg_);
    // A value is TOML when "v = <value>" parses to exactly that one key.
    std::optional<toml::table> parsed;
    try {
      const std::string doc = "v = " + value;
      toml::table t = toml::parse(doc, std::string_view("--set"));
      if (t.size() == 1 && t.contains("v")) parsed = std::move(t);
    } catch (const toml::parse_error&) {
    }
    const bool text = std::holds_alternative<std::string*>(f) ||
                      std::holds_alternative<ChoiceKey*>(f);
    if (text && !(parsed && (parsed->get("v")->is_string() || parsed->get("v")->is_array()))) {
      // unquoted text for a string key
      if (auto* p = std::get_if<std::string*>(&f))
        **p = value;
      else
        set_choice(def->full(), *std::get<ChoiceKey*>(f), value);
      origin_[def->full()] = where;
      return;
    }
    if (!parsed)
      fail(where, ": ", def->full(), ": expected ", expected_name(f), ", got '", value, "'");
    assign(*def, *parsed->get("v"), where);
  }

  Config finish() {
    validate();
    return cfg_;
  }

 private:
  static std::string trim(const std::string& s) {
    const std::size_t b = s.find_first_not_of(" \t");
    if (b == std::string::npos) return "";
    return s.substr(b, s.find_last_not_of(" \t") - b + 1);
  }

  void assign(const KeyDef& def, const toml::node& node, const std::string& where) {
    Field f = def.field(cfg_);
    const std::string key = def.full();
    if (is_data_list_key(key) && node.is_array()) {  // a blend: kept as its TOML text
      std::ostringstream os;
      os << *node.as_array();
      *std::get<std::string*>(f) = data_sources_toml(parse_data_sources(os.str(), where + ": " + key));
      origin_[key] = where;
      return;
    }
    if (key == "parallel.pipeline_layers" && node.is_array()) {  // kept as its TOML text
      std::string text = "[";
      for (const toml::node& n : *node.as_array()) {
        const std::optional<std::int64_t> v = n.value_exact<std::int64_t>();
        if (!n.is_integer() || !v || *v < INT_MIN || *v > INT_MAX)
          fail(where, ": ", key, ": expected a list of layer counts (integers), got ",
               toml_type_name(n.type()), " in it");
        text += str(text.size() > 1 ? ", " : "", *v);
      }
      *std::get<std::string*>(f) = text + "]";
      origin_[key] = where;
      return;
    }
    auto wrong = [&]() {
      fail(where, ": ", key, ": expected ", expected_name(f), ", got ",
           toml_type_name(node.type()));
    };
    if (auto* p = std::get_if<int*>(&f)) {
      if (!node.is_integer()) wrong();
      const std::int64_t v = node.as_integer()->get();
      if (v < INT_MIN || v > INT_MAX) fail(where, ": ", key, ": ", v, " is out of range");
      **p = static_cast<int>(v);
    } else if (auto* p64 = std::get_if<std::int64_t*>(&f)) {
      if (!node.is_integer()) wrong();
      **p64 = node.as_integer()->get();
    } else if (auto* pd = std::get_if<double*>(&f)) {
      if (node.is_integer())  // integers are fine where a float is expected
        **pd = static_cast<double>(node.as_integer()->get());
      else if (node.is_floating_point())
        **pd = node.as_floating_point()->get();
      else
        wrong();
    } else if (auto* pb = std::get_if<bool*>(&f)) {
      if (!node.is_boolean()) wrong();
      **pb = node.as_boolean()->get();
    } else if (auto* ps = std::get_if<std::string*>(&f)) {
      if (!node.is_string()) wrong();
      **ps = node.as_string()->get();
    } else if (auto* pc = std::get_if<ChoiceKey*>(&f)) {
      if (!node.is_string()) wrong();
      set_choice(key, **pc, node.as_string()->get());
    }
    origin_[key] = where;
  }

  // A word that is not one of the choice's is refused by validate(), in its turn among the
  // rules (need_choice), so that errors come in the same order whatever the key's type.
  void set_choice(const std::string& key, ChoiceKey& c, const std::string& word) {
    const std::vector<std::string> words = c.choices();
    if (std::find(words.begin(), words.end(), word) == words.end()) {
      bad_word_[key] = word;
      return;
    }
    bad_word_.erase(key);
    c.choose(word);
  }

  // Where a key was set: its line in the file, the file's --set, or just the file (default).
  std::string where(const std::string& key) const {
    auto it = origin_.find(key);
    return it == origin_.end() ? source_ : it->second;
  }
  // For a rule over two keys: point at the one the user wrote (the first if both).
  std::string where(const std::string& a, const std::string& b) const {
    return origin_.count(a) || !origin_.count(b) ? where(a) : where(b);
  }

  template <typename T>
  void need(bool ok, const std::string& key, const char* rule, const T& value) const {
    if (!ok) fail(where(key), ": ", key, ": must be ", rule, ", got ", value);
  }
  void need_finite(double v, const std::string& key) const {
    if (!std::isfinite(v)) fail(where(key), ": ", key, ": must be finite, got ", toml_float(v));
  }
  void need_choice(const std::string& key) const {
    auto it = bad_word_.find(key);
    if (it == bad_word_.end()) return;
    Config c = cfg_;
    need_one_of(it->second, key, std::get<ChoiceKey*>(find_key_full(key)->field(c))->choices());
  }
  void need_one_of(const std::string& v, const std::string& key,
                   const std::vector<std::string>& allowed) const {
    if (std::find(allowed.begin(), allowed.end(), v) != allowed.end()) return;
    std::string list;
    for (std::size_t i = 0; i < allowed.size(); ++i)
      list += (i ? (i + 1 == allowed.size() ? " or " : ", ") : "") + allowed[i];
    fail(where(key), ": ", key, ": expected ", list, ", got ", toml_string(v));
  }

  // parallel.cp_mode: "ring" or "ulysses" (all-to-all over heads: each CP rank attends the
  // whole sequence with cp-th of its rank's query and key/value heads, so both divide by cp).
  void validate_cp_mode() const {
    const Config::Parallel& p = cfg_.parallel;
    need_choice("parallel.cp_mode");
    if (p.cp_mode != model::CpMode::ulysses || p.cp == 1 || p.tp_mode == model::TpMode::two_d)
      return;
    const model::ModelConfig& m = cfg_.model;
    if (m.n_head % p.tp != 0) return;  // reported with parallel.tp
    const int nh = m.n_head / p.tp, nkv = model::rank_kv_heads(m, p.tp);
    if (nh % p.cp != 0 || nkv % p.cp != 0)
      fail(where("parallel.cp_mode", "parallel.cp"), ": parallel.cp_mode = \"ulysses\" splits "
           "each rank's attention heads over parallel.cp = ", p.cp, ": needs its ", nh,
           " query heads (model.n_head / parallel.tp) and ", nkv, " key/value heads divisible "
           "by ", p.cp, "; use parallel.cp_mode = \"ring\" or another parallel.cp");
  }

  // parallel.tp_mode: "2d" (SUMMA on a q x q grid, issue 20; model::Gpt2dStage, model/gpt2d_stage.hpp):
  // what 2D needs and what it does not do, one error each; commands that do not run it
  // (allow_tp2d false: trident plan) refuse it rather than run something else.
  void validate_tp_mode() const {
    const Config::Parallel& p = cfg_.parallel;
    need_choice("parallel.tp_mode");
    if (p.tp_mode != model::TpMode::two_d) return;
    if (parallel::tp2d_side(p.tp) == 0)
      fail(where("parallel.tp_mode", "parallel.tp"),
           ": parallel.tp_mode = \"2d\" needs parallel.tp a perfect square q*q (4, 9, 16, ...), "
           "got ", p.tp);
    // What 2D TP will not do even once wired (docs/tp2d.md), one error each.
    if (p.cp > 1)
      fail(where("parallel.tp_mode", "parallel.cp"),
           ": parallel.tp_mode = \"2d\" does not combine with context parallelism (its "
           "attention is not the ring); expected parallel.cp = 1, got ", p.cp);
    if (p.sequence_parallel)
      fail(where("parallel.tp_mode", "parallel.sequence_parallel"),
           ": parallel.tp_mode = \"2d\" does not combine with parallel.sequence_parallel (the "
           "grid already splits the token rows); expected parallel.sequence_parallel = false");
    if (cfg_.model.arch != model::Arch::gpt2)
      fail(where("parallel.tp_mode", "model.arch"),
           ": parallel.tp_mode = \"2d\" is built for model.arch = \"gpt2\" only, got \"llama\"");
    if (cfg_.runtime.device == RuntimeDevice::cuda)
      fail(where("parallel.tp_mode", "runtime.device"),
           ": parallel.tp_mode = \"2d\" runs on the CPU backend only (its LayerNorm is host "
           "code); expected runtime.device = \"cpu\"");
    // What the 2D model does not implement (docs/tp2d.md, "What remains").
    if (p.recompute.get() != model::Recompute::none)
      fail(where("parallel.tp_mode", "parallel.recompute"),
           ": parallel.tp_mode = \"2d\" does not recompute activations; expected "
           "parallel.recompute = \"none\", got ", toml_string(p.recompute.word()));
    if (p.vpp != 1)
      fail(where("parallel.tp_mode", "parallel.vpp"), ": parallel.tp_mode = \"2d\" runs one "
           "model chunk per pipeline rank; expected parallel.vpp = 1, got ", p.vpp);
    if (p.schedule->update == pipeline::WeightUpdate::per_microbatch)
      fail(where("parallel.tp_mode", "parallel.schedule"), ": parallel.tp_mode = \"2d\" does "
           "not run parallel.schedule = \"pipedream\" (untested with 2D); expected naive, gpipe, "
           "1f1b or pipedream-2bw");
    if (splits_backward(p.schedule.kind(), p.pp))
      fail(where("parallel.tp_mode", "parallel.schedule"), ": parallel.tp_mode = \"2d\" has no "
           "split backward (input and weight gradients in one pass), so it runs naive, gpipe "
           "or 1f1b, got ", toml_string(p.schedule.word()));
    const int q = parallel::tp2d_side(p.tp);
    // Each grid row takes whole sequences, each grid column whole heads and d_model / q.
    for (const auto& [key, v] : {std::pair<const char*, int>{"parallel.micro_batch_size",
                                                             p.micro_batch_size},
                                 {"model.n_head", cfg_.model.n_head},
                                 {"model.d_model", cfg_.model.d_model}})
      if (v % q != 0)
        fail(where("parallel.tp_mode", key), ": parallel.tp_mode = \"2d\" on a ", q, " x ", q,
             " grid needs ", key, " divisible by ", q, ", got ", v);
    if (!allow_tp2d_)
      fail(where("parallel.tp_mode"), ": parallel.tp_mode = \"2d\" is not supported yet by "
           "this command (trident train, step, grad and init run it; docs/tp2d.md); "
           "expected \"1d\"");
  }

  // model.arch and Llama's keys; a Llama key in a GPT-2 deck is an error (it would be ignored).
  void validate_llama() const {
    const model::ModelConfig& m = cfg_.model;
    need_choice("model.arch");
    if (!m.llama()) {
      for (const char* name : kLlamaKeys)
        if (const std::string key = std::string("model.") + name;
            key != "model.arch" && origin_.count(key))
          fail(where(key), ": ", key, " is a key of model.arch = \"llama\" (this deck's "
               "model.arch is ", toml_string(m.arch.word()), ")");
      return;
    }
    need(m.n_kv_head >= 0, "model.n_kv_head", ">= 0 (0: model.n_head)", m.n_kv_head);
    if (m.n_kv_head > 0 && m.n_head % m.n_kv_head != 0)
      fail(where("model.n_kv_head", "model.n_head"), ": model.n_kv_head = ", m.n_kv_head,
           " does not divide model.n_head = ", m.n_head);
    need(m.ffn_hidden >= 0, "model.ffn_hidden", ">= 0 (0: Llama's rule)", m.ffn_hidden);
    need(m.ffn_multiple_of >= 1, "model.ffn_multiple_of", ">= 1", m.ffn_multiple_of);
    need_finite(m.rope_theta, "model.rope_theta");
    need(m.rope_theta > 1.0, "model.rope_theta", "> 1", toml_float(m.rope_theta));
    need_finite(m.norm_eps, "model.norm_eps");
    need(m.norm_eps > 0.0, "model.norm_eps", "> 0", toml_float(m.norm_eps));
    if (m.d_model % m.n_head == 0 && m.head_dim() % 2 != 0)
      fail(where("model.d_model", "model.n_head"), ": model.arch = \"llama\" needs an even "
           "head size (rotary pairs) but model.d_model / model.n_head = ", m.d_model, " / ",
           m.n_head, " = ", m.head_dim());
  }

  // parallel.pipeline_layers: "even", "auto" or pp * vpp counts >= 1 summing to n_layer.
  void validate_pipeline_layers() const {
    const Config& c = cfg_;
    const Config::Parallel& p = c.parallel;
    const std::string key = "parallel.pipeline_layers";
    const std::int64_t stages = static_cast<std::int64_t>(p.pp) * p.vpp;
    std::vector<int> list;
    if (parse_layer_list(p.pipeline_layers, list)) {
      const std::string problem = model::stage_layers_problem(list, c.model.n_layer, int(stages));
      if (!problem.empty())
        fail(where(key), ": ", key, " = ", p.pipeline_layers, ": ", problem, " (parallel.pp = ",
             p.pp, ", parallel.vpp = ", p.vpp, ", model.n_layer = ", c.model.n_layer, ")");
      return;
    }
    if (p.pipeline_layers != "even" && p.pipeline_layers != "auto")
      fail(where(key), ": ", key, ": expected \"even\", \"auto\" or a list of layer counts ",
           "(one per virtual stage), got ", toml_string(p.pipeline_layers));
    if (c.model.n_layer < stages)
      fail(where("model.n_layer", "parallel.pp"), ": model.n_layer = ", c.model.n_layer,
           " is fewer than parallel.pp * parallel.vpp = ", p.pp, " * ", p.vpp,
           " virtual stages (each needs >= 1 layer)");
  }

  void validate() const {
    const Config& c = cfg_;
    // [model]
    need(c.model.vocab_size >= 0, "model.vocab_size", ">= 0 (0: from the dataset)",
         c.model.vocab_size);
    need(c.model.seq_len >= 1, "model.seq_len", ">= 1", c.model.seq_len);
    need(c.model.n_layer >= 1, "model.n_layer", ">= 1", c.model.n_layer);
    need(c.model.n_head >= 1, "model.n_head", ">= 1", c.model.n_head);
    need(c.model.d_model >= 1, "model.d_model", ">= 1", c.model.d_model);
    if (c.model.d_model % c.model.n_head != 0)
      fail(where("model.d_model", "model.n_head"), ": model.d_model = ", c.model.d_model,
           " is not divisible by model.n_head = ", c.model.n_head);
    validate_llama();

    // [parallel]
    const Config::Parallel& p = c.parallel;
    need(p.tp >= 1, "parallel.tp", ">= 1", p.tp);
    need(p.pp >= 1, "parallel.pp", ">= 1", p.pp);
    need(p.dp >= 0, "parallel.dp", ">= 0 (0: world size / (tp * cp * pp))", p.dp);
    need(p.cp >= 1, "parallel.cp", ">= 1", p.cp);
    // The load-balanced causal split: each sequence in 2 * cp chunks, rank r holding chunks
    // r and 2 * cp - 1 - r (Megatron's context parallelism).
    if (p.cp > 1 && c.model.seq_len % (2 * p.cp) != 0)
      fail(where("parallel.cp", "model.seq_len"), ": parallel.cp = ", p.cp,
           " needs model.seq_len = ", c.model.seq_len, " divisible by 2 * parallel.cp = ",
           2 * p.cp);
    need(p.vpp >= 1, "parallel.vpp", ">= 1", p.vpp);
    need_choice("parallel.schedule");
    // PipeDream updates each stage on its own after every backward (docs/FORMAT.md): no
    // global gradient norm, no ZeRO-1 shard step, and a wte tied across the first and last
    // stage would be two copies updated at different times.
    if (p.schedule->update == pipeline::WeightUpdate::per_microbatch) {
      if (c.train.grad_clip != 0)
        fail(where("train.grad_clip", "parallel.schedule"), ": parallel.schedule = \"pipedream\" "
             "updates each stage after every microbatch, with no global gradient norm: "
             "train.grad_clip must be 0, got ", toml_float(c.train.grad_clip));
      if (p.zero_stage != 0)
        fail(where("parallel.zero_stage", "parallel.schedule"), ": parallel.schedule = "
             "\"pipedream\" needs parallel.zero_stage = 0, got ", p.zero_stage);
      if (c.model.tied() && p.pp > 1)
        fail(where("model.tie_embeddings", "parallel.schedule"), ": parallel.schedule = "
             "\"pipedream\" at parallel.pp = ", p.pp, " needs untied embeddings (model.arch = "
             "\"llama\" with model.tie_embeddings = false; GPT-2 always ties wte): the first "
             "and last stage would update their copies of wte at different times");
    }
    need(p.micro_batch_size >= 1, "parallel.micro_batch_size", ">= 1", p.micro_batch_size);
    need(p.zero_stage == 0 || p.zero_stage == 1, "parallel.zero_stage", "0 or 1", p.zero_stage);
    need_finite(p.grad_bucket_mb, "parallel.grad_bucket_mb");
    need(p.grad_bucket_mb > 0, "parallel.grad_bucket_mb", "> 0", toml_float(p.grad_bucket_mb));
    need_choice("parallel.recompute");
    const pipeline::ScheduleKind* kind = &p.schedule.kind();
    const pipeline::ScheduleMisfit misfit = kind->misfit(p.pp, p.vpp, 0);
    if (misfit == pipeline::ScheduleMisfit::chunks)
      fail(where("parallel.vpp", "parallel.schedule"), ": parallel.vpp = ", p.vpp,
           " needs parallel.schedule = ", pipeline::join_or(pipeline::multi_chunk_schedule_names(), "\""),
           ", got ", toml_string(p.schedule.word()));
    if (misfit == pipeline::ScheduleMisfit::chunk_count)  // zb-v: exactly two chunks, a V
      fail(where("parallel.vpp", "parallel.schedule"), ": parallel.schedule = ",
           toml_string(p.schedule.word()), " needs parallel.vpp = ", kind->fixed_vpp, ", got ",
           p.vpp);
    // Chunks of one rank pass activations to each other through the pipeline's ring.
    if (p.vpp > 1 && p.pp < 2)
      fail(where("parallel.vpp", "parallel.pp"), ": parallel.vpp = ", p.vpp,
           " needs parallel.pp >= 2 (virtual stages interleave over pipeline ranks), got ",
           p.pp);
    if (p.tp_mode != model::TpMode::two_d && c.model.n_head % p.tp != 0)  // 2d: validate_tp_mode
      fail(where("model.n_head", "parallel.tp"), ": model.n_head = ", c.model.n_head,
           " is not divisible by parallel.tp = ", p.tp);
    // Llama under TP: each rank's query heads read one kv head, its own (n_kv_head split
    // over TP) or a copy (n_kv_head < tp: each kv head replicated on tp / n_kv_head ranks).
    if (c.model.llama() && c.model.n_head % p.tp == 0) {
      const int kv = c.model.kv_heads();
      if (kv >= p.tp ? kv % p.tp != 0 : p.tp % kv != 0)
        fail(where("model.n_kv_head", "parallel.tp"), ": model.n_kv_head = ", kv,
             " and parallel.tp = ", p.tp, ": one must divide the other (kv heads are split ",
             "over TP, or each serves tp / n_kv_head ranks)");
      if (c.model.d_ff() % p.tp != 0)
        fail(where("model.ffn_hidden", "parallel.tp"), ": model.ffn_hidden = ",
             c.model.d_ff(), " is not divisible by parallel.tp = ", p.tp);
    }
    validate_pipeline_layers();
    if (p.sequence_parallel && c.model.seq_len % p.tp != 0)
      fail(where("parallel.sequence_parallel", "model.seq_len"),
           ": parallel.sequence_parallel needs model.seq_len = ", c.model.seq_len,
           " divisible by parallel.tp = ", p.tp);
    validate_tp_mode();
    validate_cp_mode();
    validate_layout_choice();

    // [train]
    const Config::Train& t = c.train;
    need(t.steps >= 1, "train.steps", ">= 1", t.steps);
    need(t.global_batch_size >= 1, "train.global_batch_size", ">= 1", t.global_batch_size);
    {
      // The sample index holds 8-byte entries per sequence drawn: bounded (and checked for
      // overflow) here, before a build of terabytes starts (issue 32: steps = 1e12, 2^63 - 1).
      constexpr std::int64_t kMaxSequences = std::int64_t(1) << 40;
      std::int64_t sequences = 0;
      if (__builtin_mul_overflow(std::int64_t(t.steps), std::int64_t(t.global_batch_size),
                                 &sequences) ||
          sequences > kMaxSequences)
        fail(where("train.steps", "train.global_batch_size"), ": train.steps * ",
             "train.global_batch_size = ", t.steps, " * ", t.global_batch_size,
             " sequences is more than the ", kMaxSequences,
             " the sample index can hold (8 bytes each: over 8 TiB)");
    }
    if (t.global_batch_size % p.micro_batch_size != 0)
      fail(where("train.global_batch_size", "parallel.micro_batch_size"),
           ": train.global_batch_size = ", t.global_batch_size,
           " is not divisible by parallel.micro_batch_size = ", p.micro_batch_size);
    for (const auto& [key, v] : {std::pair<const char*, double>{"train.lr", t.lr},
                                 {"train.min_lr", t.min_lr},
                                 {"train.weight_decay", t.weight_decay},
                                 {"train.beta1", t.beta1},
                                 {"train.beta2", t.beta2},
                                 {"train.eps", t.eps},
                                 {"train.grad_clip", t.grad_clip}})
      need_finite(v, key);
    need(t.lr > 0, "train.lr", "> 0", toml_float(t.lr));
    need(t.min_lr >= 0, "train.min_lr", ">= 0", toml_float(t.min_lr));
    if (t.min_lr > t.lr)
      fail(where("train.min_lr", "train.lr"), ": train.min_lr = ", toml_float(t.min_lr),
           " must be <= train.lr = ", toml_float(t.lr));
    need(t.warmup_steps >= 0, "train.warmup_steps", ">= 0", t.warmup_steps);
    if (t.warmup_steps > t.steps)
      fail(where("train.warmup_steps", "train.steps"), ": train.warmup_steps = ",
           t.warmup_steps, " must be <= train.steps = ", t.steps);
    need(t.weight_decay >= 0, "train.weight_decay", ">= 0", toml_float(t.weight_decay));
    need(t.beta1 >= 0 && t.beta1 < 1, "train.beta1", "in [0, 1)", toml_float(t.beta1));
    need(t.beta2 >= 0 && t.beta2 < 1, "train.beta2", "in [0, 1)", toml_float(t.beta2));
    need(t.eps > 0, "train.eps", "> 0", toml_float(t.eps));
    need(t.grad_clip >= 0, "train.grad_clip", ">= 0 (0 disables clipping)",
         toml_float(t.grad_clip));
    need(t.seed >= 0, "train.seed", ">= 0", t.seed);
    need(t.eval_every >= 0, "train.eval_every", ">= 0 (0: never)", t.eval_every);
    need(t.eval_batches >= 1, "train.eval_batches", ">= 1", t.eval_batches);
    need_choice("train.on_nonfinite");

    // [io]
    need(!c.io.out_dir.empty(), "io.out_dir", "a directory", "\"\"");
    need(c.io.checkpoint_every >= 0, "io.checkpoint_every", ">= 0 (0: only at the end)",
         c.io.checkpoint_every);
    need(c.io.keep_checkpoints >= 0, "io.keep_checkpoints", ">= 0", c.io.keep_checkpoints);
    need(!c.io.resume.empty(), "io.resume", "\"auto\", \"none\" or a checkpoint path", "\"\"");
    need(c.io.trace_step >= 0, "io.trace_step", ">= 0 (0: no trace)", c.io.trace_step);
    if (c.io.trace_step > t.steps)
      fail(where("io.trace_step", "train.steps"), ": io.trace_step = ", c.io.trace_step,
           " must be <= train.steps = ", t.steps);

    // [runtime]
    need_choice("runtime.device");
    need_choice("runtime.precision");
    if (c.runtime.precision != ops::Precision::fp32 && c.runtime.device != RuntimeDevice::cuda)
      fail(where("runtime.precision", "runtime.device"), ": runtime.precision = ",
           toml_string(c.runtime.precision.word()), " needs runtime.device = \"cuda\", got ",
           toml_string(c.runtime.device.word()));
    need(c.runtime.threads >= 0, "runtime.threads", ">= 0 (0: cores / ranks on this node)",
         c.runtime.threads);
    need_finite(c.runtime.watchdog_s, "runtime.watchdog_s");
    need(c.runtime.watchdog_s >= 0, "runtime.watchdog_s", ">= 0 (0: off)",
         toml_float(c.runtime.watchdog_s));
    // The layouts it covers are checked by the trainer (parallel.layout = "auto" picks them).
    if (c.runtime.cuda_graphs && c.runtime.device != RuntimeDevice::cuda)
      fail(where("runtime.cuda_graphs", "runtime.device"), ": runtime.cuda_graphs = true needs "
           "runtime.device = \"cuda\", got ", toml_string(c.runtime.device.word()));
  }

  // parallel.layout = "auto" chooses these keys itself: one written too would be ignored.
  void validate_layout_choice() const {
    const Config::Parallel& p = cfg_.parallel;
    need_one_of(p.layout, "parallel.layout", {"deck", "auto"});
    if (p.layout == "deck") {
      if (!p.machine.empty())
        fail(where("parallel.machine"), ": parallel.machine is read by parallel.layout = "
             "\"auto\" only; set that too, or remove parallel.machine");
      return;
    }
    for (const char* key : {"tp", "pp", "dp", "cp", "vpp", "schedule", "pipeline_layers",
                            "micro_batch_size", "sequence_parallel", "tp_mode", "zero_stage",
                            "recompute"}) {
      const std::string full = str("parallel.", key);
      if (origin_.count(full))
        fail(where(full), ": ", full, " is chosen by parallel.layout = \"auto\"; remove it, "
             "or set parallel.layout = \"deck\" to lay the run out by hand");
    }
    // The planner plans the ring only (its memory and communication model).
    if (p.cp_mode != model::CpMode::ring)
      fail(where("parallel.cp_mode", "parallel.layout"), ": parallel.layout = \"auto\" plans "
           "ring attention only; expected parallel.cp_mode = \"ring\", got ",
           toml_string(p.cp_mode.word()));
  }

  std::string source_;
  bool allow_tp2d_ = false;  // parallel.tp_mode = "2d" for the commands that run it
  Config cfg_;
  std::map<std::string, std::string> origin_;  // key -> where it was set
  std::map<std::string, std::string> bad_word_;  // choice key -> a word it does not know
};

}  // namespace

Config parse_config(const std::string& toml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides, bool allow_tp2d) {
  Loader loader(source_name, allow_tp2d);
  loader.read_text(toml_text);
  for (const std::string& ov : overrides) loader.apply_override(ov);
  return loader.finish();
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                   bool allow_tp2d) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) fail("input deck '", path, "' not found");
  if (fs::is_directory(path, ec)) fail("input deck '", path, "' is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("input deck '", path, "' cannot be read: ", std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) fail("input deck '", path, "' cannot be read: ", std::strerror(errno));
  return parse_config(text.str(), path, overrides, allow_tp2d);
}

std::string to_toml(const Config& cfg) {
  Config c = cfg;  // the key table hands out pointers into a mutable Config
  std::string out = "# trident input deck, fully resolved\n";
  std::string section;
  for (const KeyDef& k : key_table()) {
    // A GPT-2 deck prints as it always has: without model.arch and Llama's keys.
    if (!c.model.llama() && std::string(k.section) == "model" &&
        std::find(std::begin(kLlamaKeys), std::end(kLlamaKeys), std::string(k.name)) !=
            std::end(kLlamaKeys))
      continue;
    if (section != k.section) {
      out += str(section.empty() ? "" : "\n", "[", k.section, "]\n");
      section = k.section;
    }
    const Field f = k.field(c);
    const bool list = (is_data_list_key(k.full()) || k.full() == "parallel.pipeline_layers") &&
                      std::get<std::string*>(f)->rfind("[", 0) == 0;
    out += str(k.name, " = ", list ? *std::get<std::string*>(f) : field_value(f), "\n");
  }
  return out;
}

bool Config::operator==(const Config& o) const {
  // [model] compares as a model (ModelConfig: resolved sizes, so n_kv_head 0 and n_head are
  // the same); every other key through the key table.
  if (model != o.model) return false;
  Config a = *this, b = o;  // the key table hands out pointers into a mutable Config
  for (const KeyDef& k : key_table()) {
    if (std::string(k.section) == "model") continue;
    const Field fa = k.field(a), fb = k.field(b);
    const bool same = std::visit(
        [&](const auto& pa) {
          using P = std::decay_t<decltype(pa)>;
          const P& pb = std::get<P>(fb);
          if constexpr (std::is_same_v<P, ChoiceKey*>)
            return pa->current() == pb->current();
          else
            return *pa == *pb;
        },
        fa);
    if (!same) return false;
  }
  return true;
}

void resolve_world(Config& cfg, int world_size) {
  Config::Parallel& p = cfg.parallel;
  const std::string& src = cfg.source;
  TRIDENT_CHECK(world_size >= 1, "world size must be >= 1, got ", world_size);
  const std::int64_t tp_cp_pp = static_cast<std::int64_t>(p.tp) * p.cp * p.pp;
  // The keys of the product as written, parallel.cp among them only when it is set (> 1).
  const std::string keys = p.cp == 1 ? "parallel.tp * parallel.pp"
                                      : "parallel.tp * parallel.cp * parallel.pp";
  const std::string values =
      p.cp == 1 ? str(p.tp, " * ", p.pp) : str(p.tp, " * ", p.cp, " * ", p.pp);
  if (p.dp == 0) {
    if (world_size % tp_cp_pp != 0)
      fail(src, ": ", keys, " = ", values, " does not divide the world size ", world_size,
           " (parallel.dp = 0)");
    p.dp = static_cast<int>(world_size / tp_cp_pp);
  } else if (tp_cp_pp * p.dp != world_size) {
    fail(src, ": ", keys, " * parallel.dp = ", values, " * ", p.dp, " = ", tp_cp_pp * p.dp,
         " ranks, but the world has ", world_size, " (set parallel.dp = 0 to fit the world)");
  }
  const std::int64_t per_step = static_cast<std::int64_t>(p.micro_batch_size) * p.dp;
  if (cfg.train.global_batch_size % per_step != 0)
    fail(src, ": train.global_batch_size = ", cfg.train.global_batch_size,
         " is not divisible by parallel.micro_batch_size * parallel.dp = ", p.micro_batch_size,
         " * ", p.dp, " = ", per_step);
  // Megatron's interleaved schedule takes the microbatches in groups of pp per chunk.
  const std::int64_t m = cfg.train.global_batch_size / per_step;
  if (p.schedule->misfit(p.pp, p.vpp, int(m)) == pipeline::ScheduleMisfit::microbatches)
    fail(src, ": parallel.schedule = ", toml_string(p.schedule.word()), " with parallel.vpp = ",
         p.vpp, " needs the microbatches per rank (train.global_batch_size / "
         "(parallel.micro_batch_size * parallel.dp) = ", m, ") divisible by parallel.pp = ", p.pp);
}

std::vector<int> pipeline_stage_layers(const model::ModelConfig& m, const Layout& p) {
  const int stages = p.pp * p.vpp;
  std::vector<int> list;
  if (parse_layer_list(p.pipeline_layers, list)) return list;
  if (p.pipeline_layers == "even" && m.n_layer % stages == 0) return {};
  return model::balanced_stage_layers(m, stages, p.tp, p.schedule->placement);
}

std::vector<int> pipeline_stage_layers(const Config& cfg) {
  return pipeline_stage_layers(cfg.model, cfg.parallel);
}

model::MemoryLayout memory_layout(const model::ModelConfig& m, const Layout& p, int pp_rank,
                                  int tp_rank) {
  model::MemoryLayout lay;
  lay.tp = p.tp, lay.pp = p.pp, lay.dp = p.dp, lay.cp = p.cp, lay.vpp = p.vpp;
  lay.pp_rank = pp_rank, lay.tp_rank = tp_rank;
  lay.stage_layers = pipeline_stage_layers(m, p);
  lay.placement = p.schedule->placement;
  lay.micro_batch = p.micro_batch_size;
  lay.sequence_parallel = p.sequence_parallel;
  lay.recompute = p.recompute.get();
  lay.zero1 = p.zero1();
  lay.tp_2d = p.tp_mode == model::TpMode::two_d;
  lay.cp_mode = p.cp_mode.get();
  return lay;
}

model::MemoryLayout memory_layout(const Config& cfg, int pp_rank, int tp_rank) {
  return memory_layout(cfg.model, cfg.parallel, pp_rank, tp_rank);
}

int microbatches_per_rank(const Config& cfg) {
  TRIDENT_CHECK(cfg.parallel.dp >= 1, "microbatches_per_rank: parallel.dp is not resolved ",
                "(call resolve_world first)");
  return static_cast<int>(cfg.train.global_batch_size /
                          (static_cast<std::int64_t>(cfg.parallel.micro_batch_size) *
                           cfg.parallel.dp));
}

}  // namespace trident::train
