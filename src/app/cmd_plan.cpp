// `trident plan` and `trident calibrate` (FORMAT.md, "The command line"; plan/*.hpp).
// plan: rank 0 enumerates and predicts every layout (no communication; under mpirun the
// other ranks wait for its verdict), prints the ranked table or JSON, and with --validate
// runs the chosen layouts through `trident train` (a child launcher per layout) and prints
// predicted against measured step time and peak memory.
// calibrate: every rank measures (plan/calibrate.hpp); rank 0 writes the machine file.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "commands.hpp"
#include "trident/core/log.hpp"
#include "trident/io/dataset.hpp"
#include "trident/io/metrics.hpp"
#include "trident/parallel/agree.hpp"
#include "trident/parallel/process.hpp"
#include "trident/parallel/comm.hpp"
#include "trident/plan/calibrate.hpp"
#include "trident/plan/planner.hpp"
#include "trident/train/data_loader.hpp"

extern char** environ;

namespace trident::app {

train::Config load_deck_with_vocab(const DeckArgs& args) {
  train::Config c = train::load_config(args.deck, args.overrides);
  if (c.model.vocab_size == 0) {
    TRIDENT_CHECK(!c.data.train.empty(), c.source,
                  ": model.vocab_size = 0 takes the vocabulary from data.train, which is empty");
    c.model.vocab_size =
        io::read_token_dataset_header(train::first_token_file(c.data.train, "data.train"))
            .vocab_size;
  }
  return c;
}

namespace {

std::string mib(std::int64_t b) { return model::format_bytes(b); }

nlohmann::json prediction_json(const plan::StepPrediction& p) {
  const plan::Layout& l = p.layout;
  return {{"layout", l.str()},
          {"tp", l.tp}, {"cp", l.cp}, {"pp", l.pp}, {"dp", l.dp}, {"vpp", l.vpp},
          {"schedule", l.schedule.word()},
          {"micro_batch_size", l.micro_batch_size}, {"recompute", l.recompute.word()},
          {"sequence_parallel", l.sequence_parallel}, {"zero_stage", l.zero_stage},
          {"split", l.pipeline_layers}, {"pipeline_layers", p.stage_layers},
          {"microbatches", p.microbatches},
          {"fits", p.fits}, {"peak_bytes", p.memory.peak()},
          {"peak_pp_rank", p.memory_pp_rank}, {"rank0_peak_bytes", p.rank0_peak_bytes},
          {"memory_dominant", plan::memory_dominant(p.memory)},
          {"step_s", p.step_s}, {"compute_s", p.compute_s}, {"tp_comm_s", p.tp_comm_s},
          {"cp_comm_s", p.cp_comm_s},
          {"bubble_s", p.bubble_s}, {"dp_exposed_s", p.dp_exposed_s},
          {"embed_sync_s", p.embed_sync_s}, {"optimizer_s", p.optimizer_s},
          {"bubble_fraction", p.bubble_fraction}, {"tokens_per_s", p.tokens_per_s},
          {"mfu", p.mfu}, {"dominant", p.dominant}};
}

// The environment of a launcher started from this (singleton) MPI process: without the
// variables MPI set up for this process, which would make the child job join ours.
std::vector<std::string> child_environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string v = *e;
    const bool ours = v.rfind("PMIX_", 0) == 0 || v.rfind("OMPI_COMM_", 0) == 0 ||
                      v.rfind("OMPI_MCA_orte_", 0) == 0 || v.rfind("OMPI_MCA_ess", 0) == 0 ||
                      v.rfind("OMPI_MCA_pmix", 0) == 0 || v.rfind("OMPI_UNIVERSE", 0) == 0 ||
                      v.rfind("OMPI_FIRST_RANKS", 0) == 0 || v.rfind("OMPI_APP_CTX", 0) == 0 ||
                      v.rfind("OMPI_NUM_APP_CTX", 0) == 0 || v.rfind("OMPI_FILE_LOCATION", 0) == 0 ||
                      v.rfind("OMPI_MCA_initial_wdir", 0) == 0 || v.rfind("OMPI_MCA_mpi_oversubscribe", 0) == 0 ||
                      v.rfind("OMPI_MCA_shmem_RUNTIME", 0) == 0 || v.rfind("OMPI_MCA_orte", 0) == 0 ||
                      v.rfind("PRTE_", 0) == 0 || v.rfind("OMPI_MCA_prte", 0) == 0 ||
                      v.rfind("OMPI_MCA_mca_base_env_list", 0) == 0;
    if (!ours) env.push_back(v);
  }
  return env;
}

// Runs `/bin/sh -c command`, returns its exit status and its stdout + stderr.
int run_child(const std::string& command, std::string& output) {
  int fds[2];
  TRIDENT_CHECK(pipe(fds) == 0, "plan --validate: pipe: ", std::strerror(errno));
  std::vector<std::string> env = child_environment();
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  const pid_t pid = fork();
  TRIDENT_CHECK(pid >= 0, "plan --validate: fork: ", std::strerror(errno));
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
    execve("/bin/sh", const_cast<char**>(argv), envp.data());
    _exit(127);
  }
  close(fds[1]);
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) output.append(buf, std::size_t(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct Measured {
  double step_s = 0;  // median over the steps after the first
  double fastest_s = 0;  // the fastest of them
  double cpu_step_s = 0;  // --cpu-time: CPU seconds per step per rank
  double peak_mib = 0;
  int steps = 0;
};

// CPU seconds (user + system) of this process's children that have been waited for.
double children_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_CHILDREN, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

Measured measure(const std::string& exe, const PlanArgs& a, const train::Config& deck,
                 const plan::Layout& l, int index, int world) {
  const std::string out_dir = deck.io.out_dir + "/plan-validate/" + std::to_string(index);
  std::string launcher = a.launcher;
  const std::size_t at = launcher.find("{np}");
  if (at != std::string::npos) launcher.replace(at, 4, std::to_string(world));
  // The command that trains `steps` steps of the layout; its output and CPU seconds.
  auto train = [&](int steps, std::string& output, double& cpu_s) {
    std::filesystem::remove_all(out_dir);
    std::string cmd = launcher + " " + quote(exe) + " train " + quote(a.deck.deck);
    std::vector<std::string> sets = a.deck.overrides;
    for (const std::string& s : plan::layout_set_lines(l)) sets.push_back(s);
    for (const std::string& s :
         {str("train.steps=", steps), std::string("train.warmup_steps=0"),
          std::string("train.eval_every=0"),
          std::string("io.resume=none"), std::string("io.checkpoint_every=0"),
          std::string("io.final_checkpoint=false"),  // a trial: its weights are not kept
          std::string("io.trace_step=0"), "io.out_dir=" + out_dir})
      sets.push_back(s);
    for (const std::string& s : sets) cmd += " --set " + quote(s);
    const double cpu0 = children_cpu_s();
    const int rc = run_child(cmd, output);
    cpu_s = children_cpu_s() - cpu0;
    if (rc != 0) {
      std::string tail = output.size() > 600 ? output.substr(output.size() - 600) : output;
      std::replace(tail.begin(), tail.end(), '\n', ' ');
      fail("plan --validate: layout ", l.str(), ": `", cmd, "` exited ", rc, ": ", tail);
    }
  };
  std::string output;
  double cpu_s = 0;
  train(a.validate_steps, output, cpu_s);
  Measured m;
  // The run's metrics.h5: step times after the first (which pays for warm-up) and rank 0's
  // measured peak after the last step (the end-of-run report's figure).
  const std::string metrics = out_dir + "/metrics.h5";
  const std::vector<double> steps = io::read_metrics_column(metrics, "step");
  const std::vector<double> step_s = io::read_metrics_column(metrics, "step_time_s");
  const std::vector<double> peak = io::read_metrics_column(metrics, "memory/peak_bytes");
  TRIDENT_CHECK(!steps.empty() && steps.size() == step_s.size() && steps.size() == peak.size(),
                "plan --validate: layout ", l.str(), ": ", metrics, " has no complete rows");
  std::vector<double> times;
  for (std::size_t i = 0; i < steps.size(); ++i)
    if (steps[i] > 1 && step_s[i] > 0) times.push_back(step_s[i]);
  m.peak_mib = peak.back() / double(1 << 20);
  TRIDENT_CHECK(!times.empty() || a.validate_steps == 1, "plan --validate: layout ", l.str(),
                ": no step after the first in ", metrics);
  if (a.cpu_time) {
    // What the steps beyond the first two cost in CPU seconds, per rank.
    std::string short_output;
    double short_cpu = 0;
    train(2, short_output, short_cpu);
    m.cpu_step_s = (cpu_s - short_cpu) / double(a.validate_steps - 2) / double(world);
  }
  std::sort(times.begin(), times.end());
  m.step_s = times.empty() ? 0.0 : times[times.size() / 2];
  m.fastest_s = times.empty() ? 0.0 : times.front();
  m.steps = int(times.size());
  return m;
}

// Spearman's rank correlation (ties share their mean rank).
double spearman(const std::vector<double>& x, const std::vector<double>& y) {
  auto ranks = [](const std::vector<double>& v) {
    std::vector<std::size_t> i(v.size());
    for (std::size_t k = 0; k < i.size(); ++k) i[k] = k;
    std::sort(i.begin(), i.end(), [&](std::size_t a, std::size_t b) { return v[a] < v[b]; });
    std::vector<double> r(v.size());
    for (std::size_t k = 0; k < i.size();) {
      std::size_t e = k;
      while (e + 1 < i.size() && v[i[e + 1]] == v[i[k]]) ++e;
      for (std::size_t j = k; j <= e; ++j) r[i[j]] = (double(k) + double(e)) / 2.0;
      k = e + 1;
    }
    return r;
  };
  const std::vector<double> rx = ranks(x), ry = ranks(y);
  const double n = double(x.size());
  double mx = 0, my = 0;
  for (std::size_t k = 0; k < x.size(); ++k) mx += rx[k] / n, my += ry[k] / n;
  double sxy = 0, sxx = 0, syy = 0;
  for (std::size_t k = 0; k < x.size(); ++k) {
    sxy += (rx[k] - mx) * (ry[k] - my);
    sxx += (rx[k] - mx) * (rx[k] - mx);
    syy += (ry[k] - my) * (ry[k] - my);
  }
  return sxx > 0 && syy > 0 ? sxy / std::sqrt(sxx * syy) : 0.0;
}

}  // namespace

void require_fitting_layout(const train::Config& deck, const plan::Machine& machine,
                            const plan::PlanOptions& opt,
                            const std::vector<plan::StepPrediction>& ranked) {
  TRIDENT_CHECK(!ranked.empty(), deck.source, ": no layout of this model (", deck.model.n_layer,
                " layers, ", deck.model.n_head, " heads, global batch ",
                deck.train.global_batch_size, ") is valid on ", opt.nodes, " x ",
                opt.ranks_per_node, " ranks");
  if (ranked.front().fits) return;
  const plan::StepPrediction& s = ranked.front();
  fail(deck.source, ": no layout fits ", mib(machine.memory_bytes()), " per rank (", machine.source,
       ": machine.memory_gib = ", machine.memory_gib, ") on ", opt.nodes, " x ",
       opt.ranks_per_node, " ranks; the smallest, ", s.layout.str(), ", needs ",
       mib(s.memory.peak()), " on pipeline stage ", s.memory_pp_rank, ", mostly ",
       plan::memory_dominant(s.memory), " (", s.memory.describe(), ")");
}

plan::CalibrateOptions calibrate_options(const train::Config& deck, int world) {
  plan::CalibrateOptions opt;
  opt.model = deck.model;
  opt.tps.clear();
  for (int tp = 1; tp <= world; ++tp)
    if (world % tp == 0 && deck.model.n_head % tp == 0) opt.tps.push_back(tp);
  opt.micro_batches.clear();
  const std::int64_t G = deck.train.global_batch_size;
  for (int b = 1; b <= std::min<std::int64_t>(G, 64); b *= 2)
    if (G % b == 0) opt.micro_batches.push_back(b);
  if (std::find(opt.micro_batches.begin(), opt.micro_batches.end(),
                deck.parallel.micro_batch_size) == opt.micro_batches.end())
    opt.micro_batches.push_back(deck.parallel.micro_batch_size);
  opt.cps = plan::cp_candidates(deck.model.seq_len, world);  // the planner's
  return opt;
}

void write_machine_file(const std::string& path, const plan::Machine& m,
                        const std::string& header) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << plan::machine_toml(m, header);
    TRIDENT_CHECK(f.good(), tmp, ": write failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  TRIDENT_CHECK(!ec, path, ": cannot write the machine file: ", ec.message());
}

int run_plan(const PlanArgs& a) {
  train::Config deck;
  plan::Machine machine;
  std::vector<plan::StepPrediction> ranked;
  plan::PlanOptions opt;
  const int world_size = parallel::world_size();
  parallel::agree([&] {
    TRIDENT_CHECK(a.nodes >= 1, "plan: --nodes must be >= 1, got ", a.nodes);
    TRIDENT_CHECK(a.ranks_per_node >= 0, "plan: --ranks-per-node must be >= 1, got ",
                  a.ranks_per_node);
    TRIDENT_CHECK(!a.cpu_time || a.validate_steps >= 3,
                  "plan --cpu-time: --validate-steps must be >= 3 (the steps after the second are "
                  "measured), got ", a.validate_steps);
    TRIDENT_CHECK(a.validate == 0 || world_size == 1,
                  "plan --validate starts `trident train` itself (--launcher): run plan without "
                  "mpirun, got a world of ", world_size, " ranks");
    machine = plan::load_machine(a.machine);
    deck = load_deck_with_vocab(a.deck);
    opt.nodes = a.nodes;
    opt.ranks_per_node = a.ranks_per_node > 0 ? a.ranks_per_node : machine.ranks_per_node;
    opt.host_memory = deck.runtime.device != train::RuntimeDevice::cuda;
    opt.precision = deck.runtime.precision.get();
    opt.max_cp = a.max_cp;
    opt.min_cp = a.min_cp;
    if (log::rank() == 0) {
      ranked = plan::make_plan(deck, machine, opt);
      require_fitting_layout(deck, machine, opt, ranked);
    }
  });
  if (log::rank() != 0) return 0;
  const int world = opt.nodes * opt.ranks_per_node;
  const std::size_t shown =
      a.top > 0 ? std::min<std::size_t>(std::size_t(a.top), ranked.size()) : ranked.size();
  const std::size_t fitting =
      std::size_t(std::count_if(ranked.begin(), ranked.end(), [](const auto& p) { return p.fits; }));

  // The layouts to validate: the best K, or K spread evenly over the fitting ones.
  std::vector<std::size_t> picks;
  if (a.validate > 0) {
    const std::size_t k = std::min<std::size_t>(std::size_t(a.validate), fitting);
    for (std::size_t i = 0; i < k; ++i)
      picks.push_back(a.spread && k > 1 ? i * (fitting - 1) / (k - 1) : i);
  }

  nlohmann::json j;
  if (a.json) {
    j["deck"] = deck.source;
    j["machine"] = machine.name;
    j["machine_file"] = machine.source;
    j["nodes"] = opt.nodes;
    j["ranks_per_node"] = opt.ranks_per_node;
    j["memory_per_rank_bytes"] = machine.memory_bytes();
    j["layouts_valid"] = ranked.size();
    j["layouts_fitting"] = fitting;
    j["layouts"] = nlohmann::json::array();
    for (std::size_t i = 0; i < shown; ++i) j["layouts"].push_back(prediction_json(ranked[i]));
    j["best_deck_lines"] = plan::layout_deck_lines(ranked.front().layout);
  } else {
    std::printf("trident plan: %s on %d node(s) x %d ranks, machine \"%s\" (%s): %zu valid "
                "layouts, %zu fit %s per rank\n",
                deck.source.c_str(), opt.nodes, opt.ranks_per_node, machine.name.c_str(),
                machine.source.c_str(), ranked.size(), fitting,
                mib(machine.memory_bytes()).c_str());
    std::printf("%4s  %-74s %12s %11s %12s %6s %7s  %-14s %s\n", "#", "layout", "mem/rank",
                "step", "tokens/s", "MFU", "bubble", "dominant", "layers per stage");
    for (std::size_t i = 0; i < shown; ++i) {
      const plan::StepPrediction& p = ranked[i];
      std::string layers;
      for (int n : p.stage_layers) layers += str(layers.empty() ? "" : ",", n);
      std::printf("%4zu  %-74s %12s %9.4g s %12.4g %5.1f%% %6.1f%%  %-14s %s%s\n", i + 1,
                  p.layout.str().c_str(), mib(p.memory.peak()).c_str(), p.step_s,
                  p.tokens_per_s, 100 * p.mfu, 100 * p.bubble_fraction, p.dominant.c_str(),
                  layers.c_str(), p.fits ? "" : " (does not fit)");
    }
    std::printf("\nthe best layout, as deck lines:\n%s",
                plan::layout_deck_lines(ranked.front().layout).c_str());
    std::fflush(stdout);
  }

  if (!picks.empty()) {
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    TRIDENT_CHECK(n > 0, "plan --validate: cannot find this executable (/proc/self/exe)");
    exe[n] = 0;
    std::vector<double> pred, meas;
    nlohmann::json v = nlohmann::json::array();
    if (!a.json)
      std::printf("\nvalidation (%d steps each; measured step: %s; peak memory of world rank "
                  "0):\n%4s  %-74s %10s %10s %7s %12s %12s %7s\n",
                  a.validate_steps,
                  a.cpu_time ? "CPU seconds per rank of the steps after the second"
                             : "median wall time of the steps after the first",
                  "#", "layout", "pred step", "measured", "error", "pred peak", "measured",
                  "error");
    for (std::size_t i : picks) {
      const plan::StepPrediction& p = ranked[i];
      const Measured m = measure(exe, a, deck, p.layout, int(i + 1), world);
      const double pred_mib = double(p.rank0_peak_bytes) / 1048576.0;
      const double measured = a.cpu_time ? m.cpu_step_s : m.step_s;
      const double e_t = measured > 0 ? p.step_s / measured - 1 : 0, e_m = m.peak_mib > 0 ? pred_mib / m.peak_mib - 1 : 0;
      pred.push_back(p.step_s);
      meas.push_back(measured);
      v.push_back({{"rank", i + 1}, {"layout", p.layout.str()}, {"predicted_step_s", p.step_s},
                   {"measured_step_s", m.step_s}, {"fastest_step_s", m.fastest_s},
                   {"cpu_step_s", m.cpu_step_s},
                   {"timed_steps", m.steps},
                   {"predicted_rank0_peak_mib", pred_mib}, {"measured_rank0_peak_mib", m.peak_mib}});
      if (!a.json) {
        std::printf("%4zu  %-74s %8.4g s %8.4g s %+6.1f%% %8.1f MiB %8.1f MiB %+6.1f%%\n", i + 1,
                    p.layout.str().c_str(), p.step_s, measured, 100 * e_t, pred_mib, m.peak_mib,
                    100 * e_m);
        std::fflush(stdout);
      }
    }
    // --validate-steps 1 measures memory only (the first step is never timed).
    const double rho = pred.size() > 1 && a.validate_steps > 1 ? spearman(pred, meas) : 0.0;
    if (a.json) {
      j["validation"] = v;
      j["spearman"] = rho;
    } else if (a.validate_steps > 1) {
      std::printf("Spearman rank correlation of predicted and measured step time: %.3f\n", rho);
    }
  }
  if (a.json) std::printf("%s\n", j.dump(2).c_str());
  return 0;
}

int run_calibrate(const CalibrateArgs& a) {
  plan::CalibrateOptions opt;
  std::unique_ptr<ops::Ops> ops;
  const int world = parallel::world_size();
  parallel::agree([&] {
    TRIDENT_CHECK(!a.out.empty(), "calibrate: --out is required");
    TRIDENT_CHECK(a.min_seconds > 0, "calibrate: --min-seconds must be > 0");
    train::Config deck;
    if (!a.deck.deck.empty()) deck = load_deck_with_vocab(a.deck);
    else deck.model.vocab_size = 50304;  // GPT-2's, padded: shapes of a default model
    opt = calibrate_options(deck, world);
    opt.min_seconds = a.min_seconds;
    opt.best = a.best;
    opt.cpu_time = a.cpu_time;
    const parallel::NodeRanks node = parallel::node_ranks();
    ops = ops::make_ops(backend_options(deck, node));
    // The file must be writable before minutes of measuring.
    if (log::rank() == 0) {
      std::ofstream probe(a.out, std::ios::app);
      TRIDENT_CHECK(probe, a.out, ": cannot write the machine file");
    }
  });
  plan::Machine m = plan::calibrate(opt, *ops);
  m.name = a.name.empty() ? str("calibrated (", ops->name(), ", ", world, " ranks)") : a.name;
  if (log::rank() == 0) {
    write_machine_file(
        a.out, m,
        str("# trident machine file: measured by `trident calibrate` on ", world, " ranks (",
            m.ranks_per_node, " per node), backend ", ops->name(), ", model d_model ",
            opt.model.d_model, " seq_len ", opt.model.seq_len,
            ".\n# Rates are per rank with every rank working at once; links fitted to "
            "alpha + bytes/beta of a ring allreduce.\n\n"));
    std::printf("calibrate: wrote %s: GEMM up to %.3g FLOP/s, attention %.3g FLOP/s, kernels "
                "%.3g B/s; intra allreduce alpha %.3g s beta %.3g B/s, p2p %.3g s %.3g B/s; "
                "inter allreduce alpha %.3g s beta %.3g B/s, p2p %.3g s %.3g B/s; libraries' "
                "working memory %.1f MiB\n",
                a.out.c_str(), m.gemm_flops, m.attention_flops, m.kernel_bytes_per_s,
                m.intra.alpha_s, m.intra.bytes_per_s, m.intra.p2p_alpha_s,
                m.intra.p2p_bytes_per_s, m.inter.alpha_s, m.inter.bytes_per_s,
                m.inter.p2p_alpha_s, m.inter.p2p_bytes_per_s, m.library_mib);
  }
  return 0;
}

}  // namespace trident::app
