// Replays fuzz inputs through LLVMFuzzerTestOneInput without libFuzzer, so every corpus file and
// past crasher stays a regression test in every build (ctest: fuzz.replay, also under asan).
// usage: kvsdk-fuzz-replay FILE_OR_DIR...
#include <dirent.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

int replay_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    return 1;
  }
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), {});
  LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  size_t count = 0;
  int errors = 0;
  for (int i = 1; i < argc; ++i) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      std::fprintf(stderr, "missing %s\n", argv[i]);
      return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
      errors += replay_file(argv[i]);
      ++count;
      continue;
    }
    DIR* d = opendir(argv[i]);
    for (dirent* e; d && (e = readdir(d));) {
      const std::string name = e->d_name;
      if (name == "." || name == ".." || name[0] == '.') continue;
      errors += replay_file(std::string(argv[i]) + "/" + name);
      ++count;
    }
    if (d) closedir(d);
  }
  std::printf("replayed %zu inputs\n", count);
  return errors == 0 && count > 0 ? 0 : 1;
}
