// What the native client and the native PS worker share about making calls: call errors
// that say what failed and why, deadlines, method names gRPC may keep, tensor content.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>

namespace tfgrpc {

// A failed or wrong call: the message says what and why.
struct CallError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline const char* code_name(grpc::StatusCode code) {
  static const char* names[] = {"OK",
                                "CANCELLED",
                                "UNKNOWN",
                                "INVALID_ARGUMENT",
                                "DEADLINE_EXCEEDED",
                                "NOT_FOUND",
                                "ALREADY_EXISTS",
                                "PERMISSION_DENIED",
                                "RESOURCE_EXHAUSTED",
                                "FAILED_PRECONDITION",
                                "ABORTED",
                                "OUT_OF_RANGE",
                                "UNIMPLEMENTED",
                                "INTERNAL",
                                "UNAVAILABLE",
                                "DATA_LOSS",
                                "UNAUTHENTICATED"};
  int index = static_cast<int>(code);
  return index >= 0 && index <= 16 ? names[index] : "UNKNOWN";
}

inline void check(const grpc::Status& status, const std::string& what) {
  if (!status.ok()) {
    throw CallError(what + " failed: " + code_name(status.error_code()) + ": " +
                    status.error_message());
  }
}

inline void set_deadline(grpc::ClientContext* context, double seconds) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6)));
}

// Tensor content, seeded pseudo-random so nothing on the path can compress it.
inline grpc::Slice make_content(int64_t nbytes) {
  std::string out(static_cast<size_t>(nbytes), '\0');
  uint64_t state = 0x9E3779B97F4A7C15ULL;
  for (size_t i = 0; i < out.size(); i += 8) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    std::memcpy(&out[i], &state, std::min<size_t>(8, out.size() - i));
  }
  return grpc::Slice(out);
}

// gRPC keeps a method name's pointer, not a copy: names live in a set for the process.
inline const char* interned(const std::string& path) {
  static std::mutex mutex;
  static std::set<std::string> names;
  std::lock_guard<std::mutex> lock(mutex);
  return names.insert(path).first->c_str();
}

}  // namespace tfgrpc
