#include "util/error.h"

namespace kvsdk {

namespace {
thread_local std::string t_last_error;
}

void set_last_error(const char* message) {
  try {
    t_last_error = message;
  } catch (...) {
    t_last_error.clear();  // out of memory while reporting: keep an empty, valid string
  }
}

void clear_last_error() noexcept { t_last_error.clear(); }

const char* last_error() { return t_last_error.c_str(); }

}  // namespace kvsdk
