#include "target_search.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "error.h"

namespace eval {

Target parse_target(const std::string& text) {
  Target t;
  bool have_top1 = false, have_kl = false;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || !std::isfinite(v)) {
      throw llama::Error("--target: '" + item + "' is not KEY=NUMBER (top1=0.95, kl=0.01)");
    }
    if (key == "top1" && !have_top1) {
      if (!(v >= 0.0 && v <= 1.0)) throw llama::Error("--target: top1 must be in [0, 1]");
      t.min_top1 = v;
      have_top1 = true;
    } else if (key == "kl" && !have_kl) {
      if (!(v >= 0.0)) throw llama::Error("--target: kl must be >= 0");
      t.max_kl = v;
      have_kl = true;
    } else {
      throw llama::Error("--target: unknown or repeated key '" + key + "' (top1, kl)");
    }
  }
  if (!have_top1 && !have_kl) throw llama::Error("--target needs top1=X and/or kl=Y");
  return t;
}

std::string describe(const Target& t) {
  std::ostringstream o;
  if (t.min_top1 >= 0) o << "top-1 >= " << t.min_top1;
  if (t.min_top1 >= 0 && t.max_kl >= 0) o << ", ";
  if (t.max_kl >= 0) o << "KL <= " << t.max_kl;
  return o.str();
}

bool meets(const Target& t, const Point& p) {
  return p.ok && (t.min_top1 < 0 || p.top1 >= t.min_top1) && (t.max_kl < 0 || p.kl <= t.max_kl);
}

bool evicts_to_budget(const kvsdk_policy& policy) {
  switch (policy.method) {
    case KVSDK_METHOD_STREAMING_LLM:
    case KVSDK_METHOD_H2O:
    case KVSDK_METHOD_SNAPKV:
    case KVSDK_METHOD_PYRAMIDKV:
    case KVSDK_METHOD_XKV:
    case KVSDK_METHOD_SPINDLEKV:
    case KVSDK_METHOD_SMALLKV:
      return true;
    default:  // full, kivi, minicache, specache never evict (kvsdk.h): they fit or fail
      return false;
  }
}

std::string label(const Family& f) {
  if (f.save_as.empty()) return f.spec;
  kvsdk_policy live, target;
  if (kvsdk_policy_parse(&live, f.spec.c_str()) != KVSDK_OK ||
      kvsdk_policy_parse(&target, f.save_as.c_str()) != KVSDK_OK) {
    return f.spec + ">" + f.save_as;  // not one expand_families made: say both specs
  }
  return std::string(kvsdk_method_name(kvsdk_method(live.method))) + ">kivi" +
         std::to_string(target.quant_bits);
}

kvsdk_policy save_as_policy(const Family& f) {
  kvsdk_policy p;
  if (f.save_as.empty()) throw llama::Error("family '" + f.spec + "' has no save-as target");
  if (kvsdk_policy_parse(&p, f.save_as.c_str()) != KVSDK_OK) {
    throw llama::Error("save-as target '" + f.save_as + "': " + kvsdk_last_error());
  }
  p.quant_residual = kSaveAsResidual;
  return p;
}

std::vector<Family> expand_families(const std::vector<std::string>& specs,
                                    const std::function<bool(const std::string& spec,
                                                             const kvsdk_policy& policy)>& accept) {
  struct Candidate {
    std::string spec;
    kvsdk_policy policy;
  };
  std::vector<Candidate> fixed, budgeted;
  auto known = [&](const kvsdk_policy& p) {
    for (const std::vector<Candidate>* list : {&fixed, &budgeted}) {
      for (const Candidate& c : *list) {
        if (c.policy.method == p.method && c.policy.quant_bits == p.quant_bits) return true;
      }
    }
    return false;
  };
  for (const std::string& spec : specs) {
    kvsdk_policy p;
    if (kvsdk_policy_parse(&p, spec.c_str()) != KVSDK_OK) continue;  // the caller says why
    std::vector<Candidate> variants;
    if (p.quant_bits == 0) {
      variants.push_back({spec, p});
    } else {
      const std::string name = kvsdk_method_name(p.method);
      kvsdk_policy plain;
      if (kvsdk_policy_parse(&plain, name.c_str()) != KVSDK_OK) continue;
      for (int bits : {1, 2, 4, 8}) {
        const std::string v = bits == plain.quant_bits ? name : name + "+kivi" + std::to_string(bits);
        kvsdk_policy q;
        if (kvsdk_policy_parse(&q, v.c_str()) == KVSDK_OK) variants.push_back({v, q});
      }
    }
    for (const Candidate& c : variants) {
      if (known(c.policy) || !accept(c.spec, c.policy)) continue;
      (evicts_to_budget(c.policy) ? budgeted : fixed).push_back(c);
    }
  }
  // Save-as variants of the accepted exact-row sources: `full` (whose file becomes plain KIVI)
  // and the evicting ones, each method once (its first accepted spec), per width.
  std::vector<Family> fixed_save_as;
  std::vector<std::vector<Family>> budgeted_save_as(4);  // by width, in the order 2, 4, 1, 8
  const int widths[4] = {2, 4, 1, 8};
  std::vector<int32_t> sources;
  for (const std::vector<Candidate>* list : {&fixed, &budgeted}) {
    for (const Candidate& c : *list) {
      const bool full = c.policy.method == KVSDK_METHOD_FULL;
      if (c.policy.quant_bits != 0 || !(full || evicts_to_budget(c.policy))) continue;
      bool seen = false;
      for (int32_t m : sources) seen = seen || m == c.policy.method;
      if (seen) continue;
      sources.push_back(c.policy.method);
      const std::string target_method =
          full ? kvsdk_method_name(KVSDK_METHOD_KIVI) : kvsdk_method_name(kvsdk_method(c.policy.method));
      for (int bits : {1, 2, 4, 8}) {
        Family f;
        f.spec = c.spec;
        f.budgeted = !full;
        f.save_as = target_method + "+kivi" + std::to_string(bits);
        kvsdk_policy target;
        if (kvsdk_policy_parse(&target, f.save_as.c_str()) != KVSDK_OK) continue;
        target.quant_residual = kSaveAsResidual;
        if (!accept(f.save_as, target)) continue;
        if (full) {
          fixed_save_as.push_back(f);
        } else {
          for (size_t w = 0; w < 4; ++w) {
            if (widths[w] == bits) budgeted_save_as[w].push_back(f);
          }
        }
      }
    }
  }
  std::vector<Family> out;
  for (const Candidate& c : fixed) {
    Family f;
    f.spec = c.spec;
    f.budgeted = false;
    // The same method with the most bits below this one's: its snapshot bounds this one's.
    int narrower_bits = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const kvsdk_policy& o = fixed[i].policy;
      if (o.method == c.policy.method && o.quant_bits > narrower_bits &&
          c.policy.quant_bits > o.quant_bits) {
        narrower_bits = o.quant_bits;
        f.at_least = int(i);
      }
    }
    out.push_back(f);
  }
  // Full saved as KIVI: every row, but no bound between widths: the automatic residual window
  // (kSaveAsResidual) grows as the width shrinks (kvsdk.h), so fewer bits can make a larger file
  // (shakespeare-base: 1 bit 0.297 of full, 2 bits 0.242).
  out.insert(out.end(), fixed_save_as.begin(), fixed_save_as.end());
  for (const std::vector<Family>& width : budgeted_save_as) {
    out.insert(out.end(), width.begin(), width.end());
  }
  for (const Candidate& c : budgeted) out.push_back(Family{c.spec, true, -1, ""});
  return out;
}

SearchResult search(const std::vector<Family>& families, const Target& target,
                    const SearchOptions& options, const Measure& measure) {
  for (size_t i = 0; i < options.ladder.size(); ++i) {
    const double b = options.ladder[i];
    if (!(b > 0.0 && b <= 100.0) || (i > 0 && !(b < options.ladder[i - 1]))) {
      throw llama::Error("target search: the ladder must descend within (0, 100]");
    }
  }
  SearchResult r;
  // A lower bound of each family's snapshot bytes once known (its measurement at 100% for a
  // non-budgeted family, inherited through `at_least` when it was skipped); -1: unknown.
  std::vector<double> lower(families.size(), -1.0);
  auto cannot_win = [&](double bytes) { return r.found && bytes >= double(r.best.snapshot_bytes); };
  auto take = [&](size_t f, double budget) -> Trial {
    Trial t;
    t.family = f;
    t.point = measure(f, budget);
    t.point.budget_pct = budget;
    t.passed = meets(target, t.point);
    for (const Trial& e : r.trials) {
      if (e.family != f || !e.point.ok || !t.point.ok) continue;
      const bool lower_budget_larger =
          (e.point.budget_pct < budget && e.point.snapshot_bytes > t.point.snapshot_bytes) ||
          (e.point.budget_pct > budget && e.point.snapshot_bytes < t.point.snapshot_bytes);
      r.violations += lower_budget_larger;
    }
    // The smallest measured passing snapshot; on a tie the smaller budget.
    if (t.passed && (!r.found || t.point.snapshot_bytes < r.best.snapshot_bytes ||
                     (t.point.snapshot_bytes == r.best.snapshot_bytes &&
                      budget < r.best.budget_pct))) {
      r.found = true;
      r.family = f;
      r.best = t.point;
    }
    r.trials.push_back(t);
    return t;
  };
  for (size_t f = 0; f < families.size(); ++f) {
    const Family& fam = families[f];
    if (fam.at_least >= 0 && size_t(fam.at_least) < f && lower[size_t(fam.at_least)] >= 0 &&
        cannot_win(lower[size_t(fam.at_least)])) {
      lower[f] = lower[size_t(fam.at_least)];
      ++r.pruned;
      r.skipped.push_back(f);
      continue;
    }
    if (!fam.budgeted) {
      const Trial t = take(f, 100.0);
      if (t.point.ok) lower[f] = double(t.point.snapshot_bytes);
      continue;
    }
    // Coarse: down the ladder until more than `ladder_patience` rungs in a row fail. `hi` is
    // the smallest passing rung (or the unmeasured 100% bracket), `lo` the failing rung right
    // below it.
    double hi = 100.0, lo = 0.0;
    Trial lo_trial;
    bool bracketed = false;
    int failed_in_a_row = 0;
    for (double b : options.ladder) {
      const Trial t = take(f, b);
      if (t.passed) {
        hi = b;
        bracketed = false;
        failed_in_a_row = 0;
        continue;
      }
      if (!bracketed) {
        lo = b;
        lo_trial = t;
        bracketed = true;
      }
      if (++failed_in_a_row > options.ladder_patience) break;
    }
    if (!bracketed) continue;  // passes down to the ladder's floor
    // Fine: bisect (lo, hi). Every budget in it keeps at least lo's rows, so once lo's snapshot
    // is no smaller than the best, nothing in the bracket can win.
    for (int step = 0; step < options.bisect_steps; ++step) {
      if (lo_trial.point.ok && cannot_win(double(lo_trial.point.snapshot_bytes))) {
        ++r.pruned;
        break;
      }
      const double mid = 0.5 * (lo + hi);
      const Trial t = take(f, mid);
      if (t.passed) {
        hi = mid;
      } else {
        lo = mid;
        lo_trial = t;
      }
    }
  }
  return r;
}

}  // namespace eval
