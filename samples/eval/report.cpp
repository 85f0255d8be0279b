#include "report.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <map>
#include <sstream>

#include "error.h"

namespace eval {

namespace {

std::string json_string(const std::string& s) {
  std::ostringstream o;
  o << '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o << '\\' << c;
    } else if (c < 0x20) {
      o << "\\u" << std::hex << std::setw(4) << std::setfill('0') << int(c) << std::dec;
    } else {
      o << c;
    }
  }
  o << '"';
  return o.str();
}

std::string number_or_null(bool ok, double v) {
  if (!ok) return "null";
  std::ostringstream o;
  o << std::setprecision(10) << v;
  return o.str();
}

std::ofstream open_out(const std::string& path) {
  std::ofstream f(path);
  if (!f) throw llama::Error("cannot write '" + path + "'");
  return f;
}

std::vector<std::string> models_in_order(const std::vector<Record>& records) {
  std::vector<std::string> models;
  for (const Record& r : records) {
    bool seen = false;
    for (const std::string& m : models) seen = seen || m == r.model;
    if (!seen) models.push_back(r.model);
  }
  return models;
}

// "h2o" for a live recipe, "h2o saved as h2o+kivi2" for one whose file is converted.
std::string recipe_text(const std::string& policy, const std::string& save_as) {
  return save_as.empty() ? policy : policy + " saved as " + save_as;
}

// The family a trial belongs to (its label; the policy where a caller set none).
std::string family_of(const TargetTrial& x) { return x.label.empty() ? x.policy : x.label; }

// The save-as targets' KIVI residual window: a row count, or negative (the library's automatic
// choice, KVSDK_QUANT_RESIDUAL_AUTO).
std::string residual_text(int residual) {
  return residual < 0 ? std::string("KVSDK_QUANT_RESIDUAL_AUTO, round(768 / head_dim x "
                                    "4^(2 - bits)) rows within 16..128")
                      : std::to_string(residual) + " rows";
}

std::string string_or_null(const std::string& s) { return s.empty() ? "null" : json_string(s); }

// kvsdk-eval --target's section: the recipe per model, then each family's smallest passing point.
void write_target_section(std::ostream& f, const std::vector<TargetRecord>& targets) {
  std::ostringstream ladder;
  for (double b : targets.front().ladder) ladder << (ladder.tellp() > 0 ? ", " : "") << b;
  f << "## Smallest snapshot meeting the target\n\n"
    << "Found by `kvsdk-eval --target` (samples/eval/target_search.h), coarse-to-fine rather than\n"
    << "on a grid: every evicting policy is run down a budget ladder (" << ladder.str() << "% of\n"
    << "the full cache's bytes) until two budgets in a row fail (fidelity after a converted save\n"
    << "is not monotone in the budget), and the budget is then bisected "
    << targets.front().bisect_steps << " times between the\n"
    << "smallest passing ladder budget and the failing one below it; policies that never evict\n"
    << "(full, kivi, minicache, specache) keep the same rows at any budget they fit and are run\n"
    << "once at 100%, at every KIVI width. A policy is skipped when it can no longer beat the best\n"
    << "snapshot found. Within a bracket the search assumes fidelity is monotone in the budget,\n"
    << "so where fidelity recovers further down it can miss a smaller recipe; what it reports is\n"
    << "always a measured point that met the target (the smallest\n"
    << "measured snapshot; `inversions` counts pairs of one policy's points whose snapshots shrink\n"
    << "as the budget grows). `snapshot` is the resume snapshot against the full cache's.\n\n"
    << "A recipe \"P saved as T\" keeps the live cache in policy P and writes its file converted\n"
    << "to T (kvsdk_save_options.target_policy, as `kvsdk recompress` does; KIVI residual window\n"
    << "of the targets: " << residual_text(targets.front().save_as_residual)
    << ");\nits fidelity is measured on "
    << "the converted cache loaded back from that file.\n\n"
    << "| model | target | recipe | budget | snapshot bytes | snapshot (x full) | top-1 agreement | "
       "KL (nats) | evaluations | pruned | inversions | seconds |\n"
    << "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const TargetRecord& t : targets) {
    f << "| " << t.model << " | " << t.target << " | ";
    if (t.found) {
      f << recipe_text(t.policy, t.save_as) << " | " << std::defaultfloat << std::setprecision(6) << t.budget_pct << "% | "
        << t.snapshot_bytes << " | " << std::fixed << std::setprecision(3)
        << double(t.snapshot_bytes) / double(t.full_snapshot_bytes ? t.full_snapshot_bytes : 1)
        << " | " << t.top1_agreement << " | " << std::setprecision(4) << t.kl << " | ";
    } else {
      f << "none meets it | - | - | - | - | - | ";
    }
    f << t.evaluations << " | " << t.pruned << " | " << t.violations << " | " << std::fixed
      << std::setprecision(0) << t.seconds << " |\n";
  }
  for (const TargetRecord& t : targets) {
    f << "\n### " << t.model << ": smallest measured passing point per policy (" << t.target
      << ")\n\n"
      << "| policy | evaluations | budget | snapshot (x full) | top-1 agreement | KL (nats) |\n"
      << "|---|---:|---:|---:|---:|---:|\n";
    std::vector<const TargetTrial*> order;  // the first trial of each family
    for (const TargetTrial& x : t.trials) {
      bool seen = false;
      for (const TargetTrial* p : order) seen = seen || family_of(*p) == family_of(x);
      if (!seen) order.push_back(&x);
    }
    for (const TargetTrial* first : order) {
      const TargetTrial* best = nullptr;
      const TargetTrial* failed = nullptr;  // the first run that failed (why, in the table)
      size_t n = 0, n_failed = 0;
      for (const TargetTrial& x : t.trials) {
        if (family_of(x) != family_of(*first)) continue;
        ++n;
        if (!x.ok) {
          ++n_failed;
          if (!failed) failed = &x;
        }
        if (x.passed && (!best || x.snapshot_bytes < best->snapshot_bytes)) best = &x;
      }
      f << "| " << recipe_text(first->policy, first->save_as) << " | " << n << " | ";
      if (best) {
        f << std::defaultfloat << std::setprecision(6) << best->budget_pct << "% | " << std::fixed
          << std::setprecision(3)
          << double(best->snapshot_bytes) / double(t.full_snapshot_bytes ? t.full_snapshot_bytes : 1)
          << " | " << best->top1_agreement << " | " << std::setprecision(4) << best->kl << " |\n";
      } else {
        f << "none passed";
        // A refusal (e.g. a save-as pair the library cannot convert) says so, not only "none".
        if (failed) f << " (" << n_failed << " failed: " << failed->status << ")";
        f << " | - | - | - |\n";
      }
    }
    if (!t.skipped.empty()) {
      f << "\nNot measured (a narrower KIVI width of the same policy already could not beat the "
           "best):";
      for (size_t k = 0; k < t.skipped.size(); ++k) f << (k ? ", " : " ") << t.skipped[k];
      f << ".\n";
    }
  }
  f << "\n";
}

}  // namespace

void write_json(const std::string& path, const std::vector<Record>& records,
                const std::vector<TargetRecord>& targets) {
  std::ofstream f = open_out(path);
  f << (targets.empty() ? "[\n" : "{\"records\": [\n");
  for (size_t i = 0; i < records.size(); ++i) {
    const Record& r = records[i];
    f << "  {\"model\": " << json_string(r.model) << ", \"policy\": " << json_string(r.policy)
      << ", \"budget_pct\": " << r.budget_pct << ", \"budget_bytes\": " << r.budget_bytes
      << ", \"status\": " << json_string(r.status)
      << ", \"cache_bytes\": " << (r.ok ? std::to_string(r.cache_bytes) : "null")
      << ", \"full_cache_bytes\": " << r.full_cache_bytes
      << ", \"snapshot_bytes\": " << (r.ok ? std::to_string(r.snapshot_bytes) : "null")
      << ", \"full_snapshot_bytes\": " << r.full_snapshot_bytes
      << ", \"ppl\": " << number_or_null(r.ok, r.ppl)
      << ", \"ppl_full\": " << number_or_null(true, r.ppl_full)
      << ", \"top1_agreement\": " << number_or_null(r.ok, r.top1_agreement)
      << ", \"kl\": " << number_or_null(r.ok, r.kl)
      << ", \"context_tokens\": " << r.context_tokens << ", \"prompt_tokens\": " << r.prompt_tokens;
    if (r.fetch_hit_rate >= 0) f << ", \"fetch_hit_rate\": " << number_or_null(r.ok, r.fetch_hit_rate);
    if (!r.ok) f << ", \"error\": " << json_string(r.error);
    f << "}" << (i + 1 < records.size() ? "," : "") << "\n";
  }
  f << "]";
  if (!targets.empty()) {
    f << ",\n\"models\": [\n";
    for (size_t i = 0; i < targets.size(); ++i) {
      const TargetRecord& t = targets[i];
      f << "  {\"model\": " << json_string(t.model) << ", \"target\": {"
        << "\"goal\": {\"top1\": " << number_or_null(t.min_top1 >= 0, t.min_top1)
        << ", \"kl\": " << number_or_null(t.max_kl >= 0, t.max_kl) << "}"
        << ", \"found\": " << (t.found ? "true" : "false")
        << ", \"recipe\": ";
      if (t.found) {
        f << "{\"policy\": " << json_string(t.policy) << ", \"save_as\": " << string_or_null(t.save_as)
          << ", \"label\": " << json_string(t.label.empty() ? t.policy : t.label)
          << ", \"budget_pct\": " << number_or_null(true, t.budget_pct)
          << ", \"budget_bytes\": " << t.budget_bytes << "}";
      } else {
        f << "null";
      }
      f << ", \"snapshot_bytes\": " << (t.found ? std::to_string(t.snapshot_bytes) : "null")
        << ", \"full_snapshot_bytes\": " << t.full_snapshot_bytes
        << ", \"ratio\": "
        << number_or_null(t.found && t.full_snapshot_bytes,
                          t.full_snapshot_bytes ? double(t.snapshot_bytes) / double(t.full_snapshot_bytes) : 0)
        << ", \"top1_agreement\": " << number_or_null(t.found, t.top1_agreement)
        << ", \"kl\": " << number_or_null(t.found, t.kl)
        << ", \"context_tokens\": " << t.context_tokens << ", \"prompt_tokens\": " << t.prompt_tokens
        << ", \"families\": " << t.families << ", \"evaluations\": " << t.evaluations
        << ", \"pruned\": " << t.pruned << ", \"snapshot_inversions\": " << t.violations
        << ", \"save_as_residual\": "
        << (t.save_as_residual < 0 ? std::string("\"auto\"") : std::to_string(t.save_as_residual))
        << ", \"seconds\": " << number_or_null(true, t.seconds) << ",\n    \"trials\": [";
      for (size_t k = 0; k < t.trials.size(); ++k) {
        const TargetTrial& x = t.trials[k];
        f << (k ? ",\n      " : "\n      ") << "{\"policy\": " << json_string(x.policy)
          << ", \"save_as\": " << string_or_null(x.save_as)
          << ", \"label\": " << json_string(family_of(x))
          << ", \"budget_pct\": " << number_or_null(true, x.budget_pct)
          << ", \"status\": " << json_string(x.status)
          << ", \"snapshot_bytes\": " << (x.ok ? std::to_string(x.snapshot_bytes) : "null")
          << ", \"top1_agreement\": " << number_or_null(x.ok, x.top1_agreement)
          << ", \"kl\": " << number_or_null(x.ok, x.kl)
          << ", \"passed\": " << (x.passed ? "true" : "false");
        if (!x.ok && !x.error.empty()) f << ", \"error\": " << json_string(x.error);
        f << "}";
      }
      f << "],\n    \"skipped\": [";
      for (size_t k = 0; k < t.skipped.size(); ++k) f << (k ? ", " : "") << json_string(t.skipped[k]);
      f << "]}}" << (i + 1 < targets.size() ? "," : "") << "\n";
    }
    f << "]}";
  }
  f << "\n";
  if (!f) throw llama::Error("error writing '" + path + "'");
}

void write_markdown(const std::string& path, const std::vector<Record>& records,
                    const std::vector<TargetRecord>& targets) {
  std::ofstream f = open_out(path);
  f << "# kvsdk fidelity evaluation\n\n"
    << "Budgets are shares of the full cache's bytes for the whole sequence; `cache KiB` is the\n"
    << "most the cache held during the run. Perplexity is exp of the mean negative log-likelihood\n"
    << "of every token of the evaluation text but the first, each predicted from all tokens before\n"
    << "it (teacher-forced, no BOS added: stories260K's self-generated text starts with BOS, which\n"
    << "is context only; the character-level shakespeare models were trained without BOS, so their\n"
    << "first character is context only). Top-1 agreement and\n"
    << "KL(full || policy) of next-token distributions over a greedy continuation of the full\n"
    << "model (teacher-forced), measured after a real resume: the conversation is saved (default\n"
    << "options) after every prompt token but the last, loaded back, and every scored step runs\n"
    << "on the loaded cache. `failed` rows could not stay within the budget. `snapshot` is the\n"
    << "size of that resume snapshot as a share of the full cache's snapshot at the same point.\n\n";
  if (!targets.empty()) write_target_section(f, targets);
  if (records.empty() && !targets.empty()) {
    if (!f) throw llama::Error("error writing '" + path + "'");
    return;
  }
  f << "## Smallest snapshot at top-1 agreement >= 0.95\n\n"
    << "| model | policy | budget | snapshot (x full) | top-1 agreement | KL (nats) |\n"
    << "|---|---|---:|---:|---:|---:|\n";
  for (const std::string& model : models_in_order(records)) {
    const Record* best = nullptr;
    for (const Record& r : records) {
      if (r.model != model || !r.ok || r.top1_agreement < 0.95 || r.snapshot_bytes == 0) continue;
      if (!best || r.snapshot_bytes < best->snapshot_bytes) best = &r;
    }
    if (!best) continue;
    f << "| " << model << " | " << best->policy << " | " << best->budget_pct << "% | "
      << std::fixed << std::setprecision(3)
      << double(best->snapshot_bytes) / double(best->full_snapshot_bytes) << " | "
      << best->top1_agreement << " | " << std::setprecision(4) << best->kl << " |\n";
  }
  for (const std::string& model : models_in_order(records)) {
    f << "\n## " << model << "\n\n"
      << "| policy | budget | cache KiB | snapshot (x full) | ppl | ppl full | top-1 agreement | "
         "KL (nats) | status |\n"
      << "|---|---:|---:|---:|---:|---:|---:|---:|---|\n";
    for (const Record& r : records) {
      if (r.model != model) continue;
      f << "| " << r.policy << " | " << r.budget_pct << "% | ";
      if (r.ok) {
        f << std::fixed << std::setprecision(1) << double(r.cache_bytes) / 1024.0 << " | "
          << std::setprecision(3)
          << (r.full_snapshot_bytes ? double(r.snapshot_bytes) / double(r.full_snapshot_bytes) : 0.0)
          << " | " << r.ppl << " | " << r.ppl_full << " | " << r.top1_agreement
          << " | " << std::setprecision(4) << r.kl << " | ok";
        if (r.fetch_hit_rate >= 0) f << " (fetch hit rate " << std::setprecision(3) << r.fetch_hit_rate << ")";
        f << " |\n";
      } else {
        f << "- | - | - | " << std::fixed << std::setprecision(3) << r.ppl_full << " | - | - | "
          << (r.status == "skipped" ? "skipped (" + r.error + ")" : "failed (" + r.status + ")")
          << " |\n";
      }
    }
  }
  if (!f) throw llama::Error("error writing '" + path + "'");
}

namespace {
// Runs gnuplot on `script_path`, then removes it and `data_path`.
void run_gnuplot(const std::string& script_path, const std::string& data_path) {
  const std::string cmd = "gnuplot '" + script_path + "'";
  if (std::system(cmd.c_str()) != 0) {
    throw llama::Error("gnuplot failed (is it installed? scripts/bootstrap.sh installs gnuplot-nox)");
  }
  std::remove(data_path.c_str());
  std::remove(script_path.c_str());
}
}  // namespace

void write_plot(const std::string& path, const std::vector<Record>& records) {
  const std::vector<std::string> models = models_in_order(records);
  const std::string data_path = path + ".dat";
  const std::string script_path = path + ".gp";
  {
    // One gnuplot data block per (model, policy): memory share (%), top-1 agreement, KL.
    std::ofstream d = open_out(data_path);
    for (const std::string& model : models) {
      std::map<std::string, std::vector<const Record*>> by_policy;
      std::vector<std::string> order;
      for (const Record& r : records) {
        if (r.model != model || !r.ok) continue;
        if (!by_policy.count(r.policy)) order.push_back(r.policy);
        by_policy[r.policy].push_back(&r);
      }
      for (const std::string& p : order) {
        d << "# " << model << " " << p << "\n";
        for (const Record* r : by_policy[p]) {
          d << 100.0 * double(r->cache_bytes) / double(r->full_cache_bytes) << " "
            << r->top1_agreement << " " << r->kl << "\n";
        }
        d << "\n\n";
      }
    }
  }
  std::ofstream g = open_out(script_path);
  // Each panel keeps its legend outside, to the right of its axes, so that no key covers a point.
  g << "set terminal pngcairo size " << 620 * models.size() << "," << 440 * 2 << " font ',10'\n"
    << "set output '" << path << "'\n"
    << "set multiplot layout 2," << models.size() << " title 'kvsdk: quality vs KV memory'\n"
    << "set grid\nset key outside right top noenhanced samplen 2 spacing 0.9 font ',8'\n"
    << "set xrange [0:105]\n";
  size_t block = 0;
  std::vector<std::pair<size_t, std::vector<std::string>>> blocks_per_model;
  for (const std::string& model : models) {
    std::vector<std::string> names;
    for (const Record& r : records) {
      if (r.model != model || !r.ok) continue;
      bool seen = false;
      for (const std::string& n : names) seen = seen || n == r.policy;
      if (!seen) names.push_back(r.policy);
    }
    blocks_per_model.emplace_back(block, names);
    block += names.size();
  }
  for (int panel = 0; panel < 2; ++panel) {
    for (size_t m = 0; m < models.size(); ++m) {
      g << "set title '" << models[m] << "'\nset xlabel 'cache bytes (% of full)'\n";
      g << (panel == 0 ? "set ylabel 'top-1 agreement'\nset yrange [0:1.05]\nunset logscale y\n"
                       : "set ylabel 'mean KL (nats)'\nset yrange [0:*]\n");
      const auto& [first, names] = blocks_per_model[m];
      if (names.empty()) {
        g << "plot NaN notitle\n";
        continue;
      }
      g << "plot ";
      for (size_t i = 0; i < names.size(); ++i) {
        g << (i ? ", " : "") << "'" << data_path << "' index " << first + i << " using 1:"
          << (panel == 0 ? 2 : 3) << " with linespoints pointsize 1.5 title '" << names[i] << "'";
      }
      g << "\n";
    }
  }
  g << "unset multiplot\n";
  g.close();
  run_gnuplot(script_path, data_path);
}

void write_target_plot(const std::string& path, const std::vector<TargetRecord>& targets) {
  const std::string data_path = path + ".dat";
  const std::string script_path = path + ".gp";
  // Per model: one data block per policy (its measured points by budget: snapshot share, top-1),
  // then one block with the recipe alone.
  std::vector<std::vector<std::string>> names(targets.size());
  std::vector<std::vector<bool>> converted(targets.size());  // per series: a save-as family
  {
    std::ofstream d = open_out(data_path);
    for (size_t m = 0; m < targets.size(); ++m) {
      const TargetRecord& t = targets[m];
      const double full = double(std::max<uint64_t>(1, t.full_snapshot_bytes));
      std::map<std::string, std::vector<const TargetTrial*>> by_policy;
      for (const TargetTrial& r : t.trials) {
        if (!r.ok) continue;
        const std::string name = family_of(r);
        if (!by_policy.count(name)) {
          names[m].push_back(name);
          converted[m].push_back(!r.save_as.empty());
        }
        by_policy[name].push_back(&r);
      }
      for (const std::string& p : names[m]) {
        std::vector<const TargetTrial*>& pts = by_policy[p];
        std::sort(pts.begin(), pts.end(), [](const TargetTrial* a, const TargetTrial* b) {
          return a->budget_pct < b->budget_pct;
        });
        d << "# " << t.model << " " << p << "\n";
        for (const TargetTrial* r : pts) {
          d << double(r->snapshot_bytes) / full << " " << r->top1_agreement << "\n";
        }
        d << "\n\n";
      }
      d << "# " << t.model << " recipe\n";
      if (t.found) d << double(t.snapshot_bytes) / full << " " << t.top1_agreement << "\n";
      d << "\n\n";
    }
  }
  // Tall enough that the key (outside, one line per series) fits beside the axes.
  size_t series = 0;
  for (const std::vector<std::string>& n : names) series = std::max(series, n.size() + 2);
  std::ofstream g = open_out(script_path);
  g << "set terminal pngcairo size " << 820 * std::max<size_t>(1, targets.size()) << ","
    << std::max<size_t>(480, 140 + 13 * series) << " font ',10'\n"
    << "set output '" << path << "'\n"
    << "set multiplot layout 1," << std::max<size_t>(1, targets.size())
    << " title 'kvsdk-eval --target: resume snapshot vs top-1 agreement (every measured point; "
       "dashed: P>kiviN, live P saved as KIVI-N)'\n"
    << "set grid\nset key outside right top noenhanced samplen 2 spacing 0.9 font ',8' maxrows "
    << std::max<size_t>(1, series) << "\n"
    << "set logscale x\nset xrange [0.02:1.3]\nset yrange [0.7:1.01]\n"
    << "set xlabel 'snapshot bytes (x full snapshot, log)'\nset ylabel 'top-1 agreement'\n";
  size_t block = 0;
  for (size_t m = 0; m < targets.size(); ++m) {
    const TargetRecord& t = targets[m];
    g << "set title '" << t.model << " (" << t.target << ")'\n";
    g << "plot ";
    for (size_t i = 0; i < names[m].size(); ++i) {
      g << "'" << data_path << "' index " << block++ << " using 1:2 with linespoints pointsize 1.2 "
        << (names[m][i] == "full" ? "lc rgb 'black' lw 2 " : "")
        << (converted[m][i] ? "dt 2 " : "") << "title '" << names[m][i] << "', ";
    }
    g << "'" << data_path << "' index " << block++
      << " using 1:2 with points pt 6 ps 4 lw 2 lc rgb 'red' title 'recipe'";
    if (t.min_top1 >= 0) g << ", " << t.min_top1 << " with lines dt 2 lc rgb 'red' title 'bound'";
    g << "\n";
  }
  g << "unset multiplot\n";
  g.close();
  run_gnuplot(script_path, data_path);
}

}  // namespace eval
