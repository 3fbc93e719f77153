// Machine files (see trident/plan/machine.hpp): TOML in, validated figures out.
#include "trident/plan/machine.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "trident/core/error.hpp"

namespace trident::plan {

double Machine::gemm_rate(std::int64_t m, std::int64_t n, std::int64_t k) const {
  const double f = 2.0 * double(m) * double(n) * double(k);
  const double side = double(std::min({m, n, k}));
  const GemmRate* best = nullptr;
  double best_d = 1e300;
  for (const GemmRate& g : gemms) {
    if (g.m == m && g.n == n && g.k == k) return g.flops_per_s;
    const double gf = 2.0 * double(g.m) * double(g.n) * double(g.k);
    const double gside = double(std::min({g.m, g.n, g.k}));
    const double d = std::fabs(std::log(gf / f)) + std::fabs(std::log(gside / side));
    if (std::fabs(std::log(gf / f)) <= std::log(2.0) &&
        std::fabs(std::log(gside / side)) <= std::log(2.0) && d < best_d)
      best = &g, best_d = d;
  }
  return best ? best->flops_per_s : gemm_flops;
}

namespace {

std::string where(const std::string& source, const toml::node& n) {
  const auto& b = n.source().begin;
  return b.line ? str(source, ":", b.line, ":", b.column) : source;
}

// A number (integer or float) at table[key]: finite, and > 0 (or >= 0 when zero_ok).
double number(const toml::table& t, const std::string& section, const char* key,
              const std::string& source, bool zero_ok = false) {
  const toml::node* n = t.get(key);
  const std::string name = section + "." + key;
  TRIDENT_CHECK(n, source, ": missing ", name, " (see docs/FORMAT.md, \"Machine files\")");
  std::optional<double> v = n->value<double>();
  TRIDENT_CHECK(v && (n->is_integer() || n->is_floating_point()), where(source, *n), ": ", name,
                ": expected a number");
  TRIDENT_CHECK(std::isfinite(*v) && (zero_ok ? *v >= 0 : *v > 0), where(source, *n), ": ", name,
                ": must be ", zero_ok ? ">= 0" : "> 0", ", got ", *v);
  return *v;
}

const toml::table& section(const toml::table& root, const char* name, const std::string& source) {
  const toml::node* n = root.get(name);
  TRIDENT_CHECK(n, source, ": missing section [", name, "]");
  TRIDENT_CHECK(n->is_table(), where(source, *n), ": ", name, ": expected a table");
  return *n->as_table();
}

void only_keys(const toml::table& t, const std::string& prefix, const std::set<std::string>& keys,
               const std::string& source) {
  for (const auto& [k, v] : t)
    TRIDENT_CHECK(keys.count(std::string(k.str())), where(source, v), ": unknown key '",
                  prefix.empty() ? "" : prefix + ".", k.str(), "'");
}

Link link(const toml::table& root, const char* name, const std::string& source) {
  const toml::table& t = section(root, name, source);
  only_keys(t, name, {"alpha_s", "bytes_per_s", "p2p_alpha_s", "p2p_bytes_per_s"}, source);
  Link l;
  l.alpha_s = number(t, name, "alpha_s", source, true);
  l.bytes_per_s = number(t, name, "bytes_per_s", source);
  const bool a = t.contains("p2p_alpha_s"), b = t.contains("p2p_bytes_per_s");
  TRIDENT_CHECK(a == b, source, ": [", name, "] needs both p2p_alpha_s and p2p_bytes_per_s, or "
                "neither");
  if (a) {
    l.p2p_alpha_s = number(t, name, "p2p_alpha_s", source, true);
    l.p2p_bytes_per_s = number(t, name, "p2p_bytes_per_s", source);
  }
  return l;
}

}  // namespace

Machine parse_machine(const std::string& text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    fail(source, ":", b.line, ":", b.column, ": ", e.description());
  }
  only_keys(root, "", {"machine", "compute", "intra", "inter"}, source);
  Machine m;
  m.source = source;
  const toml::table& mt = section(root, "machine", source);
  only_keys(mt, "machine",
            {"name", "ranks_per_node", "memory_gib", "peak_flops", "library_mib",
             "nonblocking_temp_ratio", "reduce_scatter_temp_ratio"},
            source);
  m.name = mt["name"].value_or(std::string(source));
  const toml::node* rpn = mt.get("ranks_per_node");
  TRIDENT_CHECK(rpn, source, ": missing machine.ranks_per_node");
  TRIDENT_CHECK(rpn->is_integer() && rpn->value<std::int64_t>().value() >= 1, where(source, *rpn),
                ": machine.ranks_per_node: expected an integer >= 1");
  m.ranks_per_node = int(rpn->value<std::int64_t>().value());
  m.memory_gib = number(mt, "machine", "memory_gib", source);
  m.peak_flops = number(mt, "machine", "peak_flops", source);
  if (const toml::node* lib = mt.get("library_mib")) {
    const std::optional<double> v = lib->value<double>();
    TRIDENT_CHECK(v && std::isfinite(*v) && *v >= 0, where(source, *lib),
                  ": machine.library_mib: expected a number >= 0 (MiB)");
    m.library_mib = *v;
  }
  if (mt.contains("nonblocking_temp_ratio"))
    m.nonblocking_temp_ratio = number(mt, "machine", "nonblocking_temp_ratio", source, true);
  if (mt.contains("reduce_scatter_temp_ratio"))
    m.reduce_scatter_temp_ratio =
        number(mt, "machine", "reduce_scatter_temp_ratio", source, true);

  const toml::table& ct = section(root, "compute", source);
  only_keys(ct, "compute",
            {"gemm_flops", "attention_flops", "kernel_bytes_per_s", "solo_speedup", "gemm"},
            source);
  if (ct.contains("solo_speedup")) {
    m.solo_speedup = number(ct, "compute", "solo_speedup", source);
    TRIDENT_CHECK(m.solo_speedup >= 1, where(source, *ct.get("solo_speedup")),
                  ": compute.solo_speedup: must be >= 1, got ", m.solo_speedup);
  }
  m.gemm_flops = number(ct, "compute", "gemm_flops", source);
  m.attention_flops = number(ct, "compute", "attention_flops", source);
  m.kernel_bytes_per_s = number(ct, "compute", "kernel_bytes_per_s", source);
  if (const toml::node* g = ct.get("gemm")) {
    TRIDENT_CHECK(g->is_array_of_tables(), where(source, *g),
                  ": compute.gemm: expected an array of tables ([[compute.gemm]])");
    for (const toml::node& e : *g->as_array()) {
      const toml::table& et = *e.as_table();
      only_keys(et, "compute.gemm", {"m", "n", "k", "flops_per_s"}, source);
      GemmRate r;
      r.m = std::int64_t(number(et, "compute.gemm", "m", source));
      r.n = std::int64_t(number(et, "compute.gemm", "n", source));
      r.k = std::int64_t(number(et, "compute.gemm", "k", source));
      r.flops_per_s = number(et, "compute.gemm", "flops_per_s", source);
      m.gemms.push_back(r);
    }
  }
  m.intra = link(root, "intra", source);
  m.inter = link(root, "inter", source);
  return m;
}

Machine load_machine(const std::string& path) {
  std::ifstream in(path);
  TRIDENT_CHECK(in, path, ": cannot read the machine file (write one with `trident calibrate ",
                "--out ", path, "`, or pass --machine with one of input/machines/*.toml)");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_machine(ss.str(), path);
}

std::string machine_toml(const Machine& m, const std::string& header) {
  std::ostringstream o;
  o.precision(6);
  if (!header.empty()) o << header;
  o << "[machine]\nname = \"" << m.name << "\"\nranks_per_node = " << m.ranks_per_node
    << "\nmemory_gib = " << m.memory_gib << "\npeak_flops = " << m.peak_flops
    << "\nlibrary_mib = " << m.library_mib
    << "\nnonblocking_temp_ratio = " << m.nonblocking_temp_ratio
    << "\nreduce_scatter_temp_ratio = " << m.reduce_scatter_temp_ratio
    << "\n\n[compute]\ngemm_flops = " << m.gemm_flops << "\nattention_flops = "
    << m.attention_flops << "\nkernel_bytes_per_s = " << m.kernel_bytes_per_s
    << "\nsolo_speedup = " << m.solo_speedup << "\n";
  for (const GemmRate& g : m.gemms)
    o << "\n[[compute.gemm]]\nm = " << g.m << "\nn = " << g.n << "\nk = " << g.k
      << "\nflops_per_s = " << g.flops_per_s << "\n";
  for (const auto& [name, l] : {std::pair<const char*, const Link*>{"intra", &m.intra},
                                {"inter", &m.inter}}) {
    o << "\n[" << name << "]\nalpha_s = " << l->alpha_s << "\nbytes_per_s = " << l->bytes_per_s
      << "\n";
    if (l->p2p_bytes_per_s > 0)
      o << "p2p_alpha_s = " << l->p2p_alpha_s << "\np2p_bytes_per_s = " << l->p2p_bytes_per_s
        << "\n";
  }
  return o.str();
}

}  // namespace trident::plan
