#include "resume_child.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>

#include "context_handle.h"
#include "error.h"
#include "sampler.h"

namespace demo {

namespace {

long to_long(const std::string& flag, const char* v) {
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || errno != 0) throw llama::Error(flag + ": not an integer: '" + v + "'");
  return n;
}

}  // namespace

bool parse_child_args(int argc, char** argv, ChildArgs* a) {
  if (argc < 3 || std::strcmp(argv[1], "--resume-child") != 0) return false;
  a->snapshot = argv[2];
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    const char* v = argv[i + 1];
    if (f == "--model") a->model_path = v;
    else if (f == "--proxy-model") a->proxy_model_path = v;
    else if (f == "--out") a->out = v;
    else if (f == "--budget") a->budget = std::strtoull(v, nullptr, 10);
    else if (f == "--position") a->at.position = int(to_long(f, v));
    else if (f == "--spec") a->at.spec = int(to_long(f, v));
    else if (f == "--pending") a->pending = int(to_long(f, v));
    else if (f == "--remaining") a->remaining = int(to_long(f, v));
    else if (f == "--temperature") a->temperature = std::strtof(v, nullptr);
    else if (f == "--rng") a->rng_state = std::strtoull(v, nullptr, 10);
    else throw llama::Error("resume child: unknown flag " + f);
  }
  return true;
}

int run_child(const ChildArgs& a) {
  const llama::Model model = llama::Model::load(a.model_path);
  std::unique_ptr<llama::Model> proxy;
  if (!a.proxy_model_path.empty()) proxy = std::make_unique<llama::Model>(llama::Model::load(a.proxy_model_path));
  llama::ContextHandle ctx(a.budget);
  PolicyRunner runner(model, proxy.get(), ctx.ctx, a.snapshot, a.at);
  llama::Sampler sampler(a.temperature, a.rng_state);
  std::vector<float> logits(size_t(model.config().vocab_size));
  std::ofstream out(a.out);
  int token = a.pending;
  for (int i = 0; i < a.remaining; ++i) {
    runner.feed(token, logits.data());
    token = sampler.sample(logits.data(), logits.size());
    out << token << "\n";
  }
  if (!out.flush()) throw llama::Error("cannot write '" + a.out + "'");
  return 0;
}

std::vector<int> resume_in_new_process(ChildArgs& a) {
  std::vector<std::string> args = {"kvsdk-demo", "--resume-child", a.snapshot,
                                   "--model", a.model_path,
                                   "--budget", std::to_string(a.budget),
                                   "--position", std::to_string(a.at.position),
                                   "--spec", std::to_string(a.at.spec),
                                   "--pending", std::to_string(a.pending),
                                   "--remaining", std::to_string(a.remaining),
                                   "--temperature", std::to_string(a.temperature),
                                   "--rng", std::to_string(a.rng_state),
                                   "--out", a.out};
  if (!a.proxy_model_path.empty()) {
    args.push_back("--proxy-model");
    args.push_back(a.proxy_model_path);
  }
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(&s[0]);
  argv.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw llama::Error(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    execv("/proc/self/exe", argv.data());
    std::fprintf(stderr, "kvsdk-demo: exec failed: %s\n", std::strerror(errno));
    _exit(127);
  }
  a.pid = int(pid);
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw llama::Error("the resumed process failed (status " + std::to_string(status) + ")");
  }
  std::ifstream in(a.out);
  std::vector<int> tokens;
  for (std::string line; std::getline(in, line);) tokens.push_back(std::atoi(line.c_str()));
  std::remove(a.out.c_str());
  if (int(tokens.size()) != a.remaining) throw llama::Error("the resumed process returned too few tokens");
  return tokens;
}

}  // namespace demo
