// Internal error handling: C++ code throws kvsdk::Error; the C ABI shim (src/api) converts it
// into a kvsdk_status plus the thread-local last-error message. No exception crosses the ABI.
#pragma once

#include <exception>
#include <new>
#include <sstream>
#include <string>
#include <utility>

#include "kvsdk.h"

namespace kvsdk {

class Error : public std::exception {
 public:
  Error(kvsdk_status status, std::string message) : status_(status), message_(std::move(message)) {}
  kvsdk_status status() const noexcept { return status_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  kvsdk_status status_;
  std::string message_;
};

// Builds a message from streamable parts: fail(KVSDK_E_INVALID_ARG, "layer ", l, " too big").
template <class... Parts>
[[noreturn]] void fail(kvsdk_status status, Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  throw Error(status, os.str());
}

void set_last_error(const char* message);
// Empties the calling thread's message (no allocation: the string keeps its capacity).
void clear_last_error() noexcept;

// Runs `body` and maps whatever it throws to a status; the single place where exceptions stop.
// A call that succeeds clears the thread's last error, so kvsdk_last_error() only ever describes
// the failure of the most recent status-returning call (include/kvsdk.h).
template <class Body>
kvsdk_status guard(const char* function, Body&& body) noexcept {
  try {
    body();
    clear_last_error();
    return KVSDK_OK;
  } catch (const Error& e) {
    set_last_error((std::string(function) + ": " + e.what()).c_str());
    return e.status();
  } catch (const std::bad_alloc&) {
    set_last_error((std::string(function) + ": out of memory").c_str());
    return KVSDK_E_NO_MEMORY;
  } catch (const std::exception& e) {
    set_last_error((std::string(function) + ": internal error: " + e.what()).c_str());
    return KVSDK_E_INTERNAL;
  } catch (...) {
    set_last_error((std::string(function) + ": internal error").c_str());
    return KVSDK_E_INTERNAL;
  }
}

}  // namespace kvsdk

// Argument checks used at the top of every API function.
#define KVSDK_REQUIRE(cond, ...) \
  do {                           \
    if (!(cond)) ::kvsdk::fail(KVSDK_E_INVALID_ARG, __VA_ARGS__); \
  } while (0)
