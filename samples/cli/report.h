// Output for the kvsdk CLI: one set of calls produces either aligned human-readable text or a
// JSON document (--json), so both views always carry the same facts.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace kvsdk_cli {

class Report {
 public:
  explicit Report(bool json) : json_(json) {}

  // A top-level or nested object; `name` is its key (ignored at the top level).
  void begin(const char* name) {
    if (json_) {
      open(name, '{');
    } else if (name && depth_ > 0) {
      std::printf("%s%s:\n", indent().c_str(), name);
    }
    ++depth_;
  }
  void end() {
    --depth_;
    if (json_) close('}');
  }
  // An array of objects (e.g. layers): begin_list, then begin(nullptr)/end() per item.
  void begin_list(const char* name) {
    if (json_) {
      open(name, '[');
    } else {
      std::printf("%s%s:\n", indent().c_str(), name);
    }
    ++depth_;
  }
  void end_list() {
    --depth_;
    if (json_) close(']');
  }

  void field(const char* key, const std::string& value) {
    if (json_) {
      key_prefix(key);
      std::printf("%s", quote(value).c_str());
    } else {
      std::printf("%s%-26s %s\n", indent().c_str(), (std::string(key) + ":").c_str(), value.c_str());
    }
  }
  void field(const char* key, const char* value) { field(key, std::string(value ? value : "")); }
  void field(const char* key, uint64_t value) { number(key, std::to_string(value)); }
  void field(const char* key, uint32_t value) { number(key, std::to_string(value)); }
  void field(const char* key, int value) { number(key, std::to_string(value)); }
  void field(const char* key, double value) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", value);
    number(key, buf);
  }
  void field(const char* key, bool value) { number(key, value ? "true" : "false"); }

  void finish() {
    if (json_) std::printf("\n");
    std::fflush(stdout);
  }

 private:
  void number(const char* key, const std::string& text) {
    if (json_) {
      key_prefix(key);
      std::printf("%s", text.c_str());
    } else {
      std::printf("%s%-26s %s\n", indent().c_str(), (std::string(key) + ":").c_str(), text.c_str());
    }
  }
  void open(const char* name, char bracket) {
    if (!first_.empty()) key_prefix(name);
    std::printf("%c", bracket);
    first_.push_back(true);
  }
  void close(char bracket) {
    first_.pop_back();
    std::printf("\n%s%c", std::string(first_.size() * 2, ' ').c_str(), bracket);
  }
  // Separator, newline, indentation and (inside objects) the quoted key.
  void key_prefix(const char* key) {
    if (!first_.back()) std::printf(",");
    first_.back() = false;
    std::printf("\n%s", std::string(first_.size() * 2, ' ').c_str());
    if (key) std::printf("%s: ", quote(key).c_str());
  }
  std::string indent() const { return std::string(depth_ > 0 ? (depth_ - 1) * 2 : 0, ' '); }
  static std::string quote(const std::string& s) {
    std::string out = "\"";
    for (unsigned char c : s) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += char(c);
      } else if (c < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        out += buf;
      } else {
        out += char(c);
      }
    }
    return out + "\"";
  }

  bool json_;
  int depth_ = 0;
  std::vector<bool> first_;
};

}  // namespace kvsdk_cli
