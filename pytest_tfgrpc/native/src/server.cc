// tfgrpc-native-server: the tensor server of pytest_tfgrpc/servers/tensor_server.py in C++.
//
// The same two services (tfgrpc.TensorService with TensorProto messages, tfgrpc.RawTensorService
// with opaque bytes) and the same seven methods, registered as byte-buffer handlers so that
// neither mode pays for a generated serializer. Protobuf mode checks every TensorProto's
// header against its length, as the Python server's decode does, and echoes the received
// buffer itself (TensorFlow's zero-copy path) instead of re-encoding a copy.
//
// It binds the one host:port it is given, prints {"target", "pid", "fabric"} as one JSON
// line once it serves, and with --exit-on-stdin-eof stops when its stdin closes.
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/support/method_handler.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "wire.h"

namespace tfgrpc {
namespace {

using grpc::ByteBuffer;
using grpc::ServerContext;
using grpc::Status;
using grpc::StatusCode;

int itemsize(int dtype) {
  static const std::map<int, int> sizes = {{1, 4}, {2, 8},  {3, 4},  {4, 1},  {5, 2},
                                           {6, 1}, {8, 8},  {9, 8},  {10, 1}, {14, 2},
                                           {17, 2}, {18, 16}, {19, 2}, {22, 4}, {23, 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

// Seeded pseudo-random bytes: tensor content nothing on the path can compress away.
std::string random_content(size_t nbytes) {
  std::string out(nbytes, '\0');
  uint64_t state = 20180401;
  for (size_t i = 0; i < nbytes; i += 8) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    std::memcpy(&out[i], &state, std::min<size_t>(8, nbytes - i));
  }
  return out;
}

struct Counters {
  std::atomic<int64_t> messages{0};
  std::atomic<int64_t> bytes{0};
  void add(int64_t m, int64_t b) {
    messages.fetch_add(m, std::memory_order_relaxed);
    bytes.fetch_add(b, std::memory_order_relaxed);
  }
};

struct Options {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string fabric = "lo";
  int64_t delay_ns = 0;
  bool exit_on_stdin_eof = false;
};

class TensorService final : public grpc::Service {
 public:
  TensorService(const std::string& mode, const Options& options, Counters* counters,
                const std::string* target)
      : protobuf_(mode == "protobuf"), options_(options), counters_(counters), target_(target) {
    using grpc::internal::RpcMethod;
    using Self = TensorService;
    // gRPC keeps the method name's pointer, not a copy: the strings live as long as we do.
    auto path = [&](const char* name) { return paths_.emplace_back(method_path(mode, name)).c_str(); };
    auto unary = [&](const char* name, Status (Self::*fn)(ServerContext*, const ByteBuffer*,
                                                           ByteBuffer*)) {
      AddMethod(new grpc::internal::RpcServiceMethod(
          path(name), RpcMethod::NORMAL_RPC,
          new grpc::internal::RpcMethodHandler<Self, ByteBuffer, ByteBuffer>(
              [fn](Self* s, ServerContext* c, const ByteBuffer* q, ByteBuffer* r) {
                return (s->*fn)(c, q, r);
              },
              this)));
    };
    auto bidi = [&](const char* name,
                    Status (Self::*fn)(ServerContext*,
                                       grpc::ServerReaderWriter<ByteBuffer, ByteBuffer>*)) {
      AddMethod(new grpc::internal::RpcServiceMethod(
          path(name), RpcMethod::BIDI_STREAMING,
          new grpc::internal::BidiStreamingHandler<Self, ByteBuffer, ByteBuffer>(
              [fn](Self* s, ServerContext* c,
                   grpc::ServerReaderWriter<ByteBuffer, ByteBuffer>* stream) {
                return (s->*fn)(c, stream);
              },
              this)));
    };
    // The order of registration is free: methods are found by path.
    unary("Echo", &Self::Echo);
    bidi("EchoStream", &Self::EchoStream);
    unary("Push", &Self::Push);
    bidi("PushStream", &Self::PushStream);
    unary("Pull", &Self::Pull);
    AddMethod(new grpc::internal::RpcServiceMethod(
        path("PullStream"), RpcMethod::SERVER_STREAMING,
        new grpc::internal::ServerStreamingHandler<Self, ByteBuffer, ByteBuffer>(
            [](Self* s, ServerContext* c, const ByteBuffer* q,
               grpc::ServerWriter<ByteBuffer>* w) { return s->PullStream(c, q, w); },
            this)));
    unary("Status", &Self::StatusCall);
  }

 private:
  void delay() const {
    if (options_.delay_ns > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(options_.delay_ns));
  }

  // A whole TensorProto: its content must end exactly where the message ends.
  Status check_tensor(const ByteBuffer& message) const {
    std::string head = peek(message, kPeekBytes);
    ContentSpan span = content_span(reinterpret_cast<const uint8_t*>(head.data()), head.size());
    if (!span.ok) return Status(StatusCode::INVALID_ARGUMENT, "not a TensorProto");
    if (span.offset + span.length != message.Length()) {
      return Status(StatusCode::INVALID_ARGUMENT,
                    "TensorProto content claims " + std::to_string(span.length) +
                        " bytes at offset " + std::to_string(span.offset) + ", message has " +
                        std::to_string(message.Length()));
    }
    return Status::OK;
  }

  Status echo_one(const ByteBuffer& request) {
    counters_->add(1, static_cast<int64_t>(request.Length()));
    delay();
    if (protobuf_) return check_tensor(request);
    return Status::OK;
  }

  Status Echo(ServerContext*, const ByteBuffer* request, ByteBuffer* reply) {
    Status status = echo_one(*request);
    if (status.ok()) *reply = *request;
    return status;
  }

  Status EchoStream(ServerContext*, grpc::ServerReaderWriter<ByteBuffer, ByteBuffer>* stream) {
    ByteBuffer request;
    while (stream->Read(&request)) {
      Status status = echo_one(request);
      if (!status.ok()) return status;
      if (!stream->Write(request)) break;
    }
    return Status::OK;
  }

  Status Push(ServerContext*, const ByteBuffer* request, ByteBuffer* reply) {
    delay();
    if (protobuf_) {
      Status status = check_tensor(*request);
      if (!status.ok()) return status;
    }
    int64_t size = static_cast<int64_t>(request->Length());
    counters_->add(1, size);
    *reply = to_buffer(encode_ack(size, 1));
    return Status::OK;
  }

  Status PushStream(ServerContext* context,
                    grpc::ServerReaderWriter<ByteBuffer, ByteBuffer>* stream) {
    int64_t message_bytes = 0;
    const auto& metadata = context->client_metadata();
    auto found = metadata.find(kMessageBytesKey);
    if (found != metadata.end()) {
      message_bytes = std::atoll(std::string(found->second.data(), found->second.size()).c_str());
    }
    ByteBuffer request;
    if (message_bytes <= 0) {
      // Refused after the first message, as the Python server does: a client whose write is
      // still under way gets this status rather than a failed write.
      stream->Read(&request);
      return Status(StatusCode::INVALID_ARGUMENT,
                    std::string("a stream must announce its message size in '") +
                        kMessageBytesKey + "' metadata");
    }
    int64_t received = 0;
    int64_t messages = 0;
    std::string first;  // the first bytes of a message's first slice (its TensorProto header)
    while (stream->Read(&request)) {
      uint64_t data_bytes = request.Length();
      if (protobuf_) {
        ChunkSpan span = chunk_span(request);
        if (!span.ok) return Status(StatusCode::INVALID_ARGUMENT, "not a TensorChunk");
        data_bytes = span.length;
        if (received == 0) first = peek(request, span.prefix + kPeekBytes).substr(span.prefix);
      }
      received += static_cast<int64_t>(data_bytes);
      if (received < message_bytes) continue;
      if (received > message_bytes) {
        return Status(StatusCode::INVALID_ARGUMENT,
                      "slices overran the announced message size: " + std::to_string(received) +
                          " > " + std::to_string(message_bytes));
      }
      if (protobuf_) {
        ContentSpan span =
            content_span(reinterpret_cast<const uint8_t*>(first.data()), first.size());
        if (!span.ok || static_cast<int64_t>(span.offset + span.length) != message_bytes) {
          return Status(StatusCode::INVALID_ARGUMENT,
                        "TensorProto of " + std::to_string(span.offset + span.length) +
                            " bytes in a " + std::to_string(message_bytes) + " B message");
        }
      }
      ++messages;
      counters_->add(1, received);
      delay();
      if (!stream->Write(to_buffer(encode_ack(received, messages)))) break;
      received = 0;
    }
    return Status::OK;
  }

  // The encoded tensor a pull returns, made once per (size, dtype) and kept (only the last).
  Status encoded(const ByteBuffer& request, grpc::Slice* out, int64_t* chunk_bytes) {
    std::vector<int64_t> fields = {0, kDtUint8, 0};
    if (!varint_fields(to_string(request), &fields) || fields[0] < 0) {
      return Status(StatusCode::INVALID_ARGUMENT, "not a PullRequest");
    }
    int64_t nbytes = fields[0];
    int dtype = static_cast<int>(fields[1]);
    *chunk_bytes = fields[2] > 0 ? fields[2] : kDefaultChunkBytes;
    int size = itemsize(dtype);
    if (size == 0) {
      return Status(StatusCode::INVALID_ARGUMENT,
                    "PullRequest with unsupported dtype number " + std::to_string(dtype));
    }
    if (nbytes % size) dtype = kDtUint8, size = 1;
    std::lock_guard<std::mutex> lock(pull_mutex_);
    if (pull_key_ != std::make_pair(nbytes, dtype) || pull_cache_.size() == 0) {
      std::string content = random_content(static_cast<size_t>(nbytes));
      std::string message =
          protobuf_ ? encode_header(dtype, {nbytes / size}, static_cast<uint64_t>(nbytes)) + content
                    : content;
      pull_cache_ = grpc::Slice(message);
      pull_key_ = {nbytes, dtype};
    }
    *out = pull_cache_;
    return Status::OK;
  }

  Status Pull(ServerContext*, const ByteBuffer* request, ByteBuffer* reply) {
    delay();
    grpc::Slice message;
    int64_t chunk_bytes = 0;
    Status status = encoded(*request, &message, &chunk_bytes);
    if (status.ok()) *reply = ByteBuffer(&message, 1);
    return status;
  }

  Status PullStream(ServerContext*, const ByteBuffer* request,
                    grpc::ServerWriter<ByteBuffer>* writer) {
    delay();
    grpc::Slice message;
    int64_t chunk = 0;
    Status status = encoded(*request, &message, &chunk);
    if (!status.ok()) return status;
    size_t total = message.size();
    for (size_t start = 0; start < total; start += static_cast<size_t>(chunk)) {
      size_t end = std::min(total, start + static_cast<size_t>(chunk));
      grpc::Slice piece = message.sub(start, end);
      bool written;
      if (protobuf_) {
        grpc::Slice parts[2] = {grpc::Slice(chunk_prefix(end - start)), piece};
        written = writer->Write(ByteBuffer(parts, 2));
      } else {
        written = writer->Write(ByteBuffer(&piece, 1));
      }
      if (!written) break;
    }
    return Status::OK;
  }

  Status StatusCall(ServerContext*, const ByteBuffer*, ByteBuffer* reply) {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    auto ns = [](const timeval& t) {
      return static_cast<uint64_t>(t.tv_sec) * 1000000000ULL +
             static_cast<uint64_t>(t.tv_usec) * 1000ULL;
    };
    std::string out;
    put_varint_field(&out, 1, static_cast<uint64_t>(getpid()));
    put_len_field(&out, 2, *target_);
    put_len_field(&out, 3, options_.fabric);
    put_varint_field(&out, 4, static_cast<uint64_t>(counters_->messages.load()));
    put_varint_field(&out, 5, static_cast<uint64_t>(counters_->bytes.load()));
    put_varint_field(&out, 6, ns(usage.ru_utime));
    put_varint_field(&out, 7, ns(usage.ru_stime));
    put_len_field(&out, 8, grpc::Version() + " (C++)");
    for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX"}) {
      const char* value = std::getenv(name);
      if (value == nullptr) continue;
      std::string entry;
      put_len_field(&entry, 1, name);
      put_len_field(&entry, 2, value);
      put_len_field(&out, 9, entry);
    }
    *reply = to_buffer(out);
    return Status::OK;
  }

  std::deque<std::string> paths_;
  const bool protobuf_;
  const Options& options_;
  Counters* counters_;
  const std::string* target_;
  std::mutex pull_mutex_;
  std::pair<int64_t, int> pull_key_{-1, 0};
  grpc::Slice pull_cache_;
};

int usage_error(const std::string& message) {
  std::cerr << "tfgrpc-native-server: error: " << message << "\n"
            << "usage: tfgrpc-native-server --host HOST [--port N] [--fabric NAME] "
               "[--delay-ns N] [--exit-on-stdin-eof]\n";
  return 2;
}

}  // namespace
}  // namespace tfgrpc

int main(int argc, char** argv) {
  using namespace tfgrpc;
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (arg == "--exit-on-stdin-eof") {
      options.exit_on_stdin_eof = true;
      continue;
    }
    const char* v = value();
    if (v == nullptr) return usage_error(arg + " needs a value");
    char* end = nullptr;
    if (arg == "--host") {
      options.host = v;
    } else if (arg == "--fabric") {
      options.fabric = v;
    } else if (arg == "--port") {
      long port = std::strtol(v, &end, 10);
      if (*end || port < 0 || port > 65535) return usage_error("--port " + std::string(v));
      options.port = static_cast<int>(port);
    } else if (arg == "--delay-ns") {
      options.delay_ns = std::strtoll(v, &end, 10);
      if (*end || options.delay_ns < 0) return usage_error("--delay-ns " + std::string(v));
    } else {
      return usage_error("unknown argument " + arg);
    }
  }

  Counters counters;
  std::string target;
  TensorService raw("raw", options, &counters, &target);
  TensorService protobuf("protobuf", options, &counters, &target);
  grpc::ServerBuilder builder;
  int bound = 0;
  builder.AddListeningPort(options.host + ":" + std::to_string(options.port),
                           grpc::InsecureServerCredentials(), &bound);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  set_arguments([&builder](const char* key, int value) { builder.AddChannelArgument(key, value); });
  // As the Python server: never share a port with another server.
  builder.AddChannelArgument("grpc.so_reuseport", 0);
  builder.RegisterService(&raw);
  builder.RegisterService(&protobuf);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound == 0) {
    std::cerr << "tfgrpc-native-server: error: cannot bind " << options.host << ":"
              << options.port << "\n";
    return 1;
  }
  target = options.host + ":" + std::to_string(bound);
  std::printf("{\"target\": \"%s\", \"pid\": %d, \"fabric\": \"%s\", \"engine\": \"native\"}\n",
              target.c_str(), static_cast<int>(getpid()), options.fabric.c_str());
  std::fflush(stdout);
  std::thread watcher;
  if (options.exit_on_stdin_eof) {
    watcher = std::thread([&server] {
      char buffer[4096];
      while (read(0, buffer, sizeof buffer) > 0) {
      }
      server->Shutdown(std::chrono::system_clock::now());
    });
  }
  server->Wait();
  if (watcher.joinable()) watcher.join();
  return 0;
}
