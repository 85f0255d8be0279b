// Errors of the reference runtime. The runtime is sample code in C++ (not part of the C ABI), so
// it reports failures as exceptions; the tools catch them in main() and print the message.
#pragma once

#include <stdexcept>
#include <string>

#include "kvsdk.h"

namespace llama {

// A model or tokenizer file is missing, truncated or inconsistent, or an argument is wrong.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A kvsdk call failed; `status` lets callers tell a budget failure (KVSDK_E_BUDGET) apart.
class KvsdkError : public Error {
 public:
  KvsdkError(kvsdk_status status, const std::string& what_call)
      : Error(what_call + " failed: " + kvsdk_status_str(status) + " (" + kvsdk_last_error() + ")"),
        status_(status) {}
  kvsdk_status status() const noexcept { return status_; }

 private:
  kvsdk_status status_;
};

// Throws KvsdkError unless `status` is KVSDK_OK.
inline void check(kvsdk_status status, const char* what_call) {
  if (status != KVSDK_OK) throw KvsdkError(status, what_call);
}

}  // namespace llama
