// Where the tests find checkpoints: the bundled shakespeare models in samples/models (always
// present) and stories260K in KVSDK_SHARED_DIR/models (absent on a fresh clone: tests skip).
#pragma once

#include <fstream>
#include <string>

namespace kvsdk_test {

inline std::string bundled_model(const std::string& file) {
  return std::string(KVSDK_SOURCE_DIR) + "/samples/models/" + file;
}

inline std::string shared_path(const std::string& relative) {
  return std::string(KVSDK_SHARED_DIR) + "/" + relative;
}

inline bool file_exists(const std::string& path) { return std::ifstream(path).good(); }

}  // namespace kvsdk_test
