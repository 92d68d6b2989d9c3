// tfgrpc-native-server: the tensor server of pytest_tfgrpc/roles/tensor_server.py in C++.
//
// The same two services (tfgrpc.TensorService with TensorProto messages, tfgrpc.RawTensorService
// with opaque bytes) and the same seven methods, served as byte buffers so that neither mode
// pays for a generated serializer. Protobuf mode checks every TensorProto's header against its
// length, as the Python server's decode does, and echoes the received buffer itself
// (TensorFlow's zero-copy path) instead of re-encoding a copy.
//
// It is an asynchronous generic server: every call is a small state machine driven by one
// thread per completion queue (--threads, default 1), so a message is read, handled and answered
// on the thread that polled it, with no hand-off between threads (gRPC's sync server hands each
// message from a poller thread to a handler thread: ~5 context switches per 1 KiB echo here).
//
// It binds the one host:port it is given, prints {"target", "pid", "fabric"} as one JSON
// line once it serves, and with --exit-on-stdin-eof stops when its stdin closes.
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "tls.h"
#include "wire.h"

namespace tfgrpc {
namespace {

using grpc::ByteBuffer;
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

struct Options {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string fabric = "lo";
  int64_t delay_ns = 0;
  int threads = 1;
  bool exit_on_stdin_eof = false;
};

// What every call shares: settings, counters, the pull cache, and the shutdown flag.
struct Shared {
  Options options;
  std::string target;
  grpc::AsyncGenericService service;
  std::atomic<int64_t> messages{0};
  std::atomic<int64_t> bytes{0};
  std::mutex pull_mutex;
  std::pair<int64_t, int> pull_key{-1, 0};
  grpc::Slice pull_cache;
  std::mutex shutdown_mutex;
  bool shutting_down = false;

  void add(int64_t m, int64_t b) {
    messages.fetch_add(m, std::memory_order_relaxed);
    bytes.fetch_add(b, std::memory_order_relaxed);
  }
  void delay() const {
    if (options.delay_ns > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(options.delay_ns));
  }
};

enum class Method { kUnknown, kEcho, kEchoStream, kPush, kPushStream, kPull, kPullStream, kStatus };

Method parse_method(const std::string& path, bool* protobuf) {
  static const std::map<std::string, Method> names = {
      {"Echo", Method::kEcho}, {"EchoStream", Method::kEchoStream}, {"Push", Method::kPush},
      {"PushStream", Method::kPushStream}, {"Pull", Method::kPull},
      {"PullStream", Method::kPullStream}, {"Status", Method::kStatus}};
  for (const char* mode : {"raw", "protobuf"}) {
    std::string prefix = method_path(mode, "");
    if (path.compare(0, prefix.size(), prefix) == 0) {
      *protobuf = std::string(mode) == "protobuf";
      auto it = names.find(path.substr(prefix.size()));
      return it == names.end() ? Method::kUnknown : it->second;
    }
  }
  return Method::kUnknown;
}

// A whole TensorProto: its content must end exactly where the message ends.
Status check_tensor(const ByteBuffer& message) {
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

// One call, from its arrival to its end. Every completion comes back as proceed(ok).
class Call {
 public:
  Call(Shared* shared, grpc::ServerCompletionQueue* cq)
      : shared_(shared), cq_(cq), stream_(&context_) {
    shared_->service.RequestCall(&context_, &stream_, cq_, cq_, this);
  }

  void proceed(bool ok) {
    switch (state_) {
      case State::kRequested:
        if (!ok) return finished();  // the server is shutting down
        respawn();
        start();
        return;
      case State::kReading:
        if (!ok) return end_of_input();
        return on_message();
      case State::kWriting:
        if (!ok) return finish(Status(StatusCode::CANCELLED, "the client went away"));
        return after_write();
      case State::kFinishing:
        return finished();
    }
  }

 private:
  enum class State { kRequested, kReading, kWriting, kFinishing };

  void respawn() {
    std::lock_guard<std::mutex> lock(shared_->shutdown_mutex);
    if (!shared_->shutting_down) new Call(shared_, cq_);
  }

  void start() {
    method_ = parse_method(context_.method(), &protobuf_);
    if (method_ == Method::kUnknown) {
      return finish(Status(StatusCode::UNIMPLEMENTED, "no method " + context_.method()));
    }
    if (method_ == Method::kPushStream) {
      const auto& metadata = context_.client_metadata();
      auto found = metadata.find(kMessageBytesKey);
      if (found != metadata.end()) {
        message_bytes_ =
            std::atoll(std::string(found->second.data(), found->second.size()).c_str());
      }
      if (message_bytes_ < 0) {  // 0 B is a message too (an empty tensor), as in Python
        // Refused after the first message, as the Python server does: a client whose write
        // is still under way gets this status rather than a failed write.
        refusal_ = Status(StatusCode::INVALID_ARGUMENT,
                          std::string("a stream must announce its message size in '") +
                              kMessageBytesKey + "' metadata");
      }
    }
    read();
  }

  void read() {
    state_ = State::kReading;
    stream_.Read(&request_, this);
  }

  void write(const ByteBuffer& reply) {
    state_ = State::kWriting;
    stream_.Write(reply, this);
  }

  void reply_and_finish(const ByteBuffer& reply) {
    state_ = State::kFinishing;
    stream_.WriteAndFinish(reply, grpc::WriteOptions(), Status::OK, this);
  }

  void finish(const Status& status) {
    state_ = State::kFinishing;
    stream_.Finish(status, this);
  }

  void finished() { delete this; }

  void end_of_input() {
    bool unary = method_ == Method::kEcho || method_ == Method::kPush ||
                 method_ == Method::kPull || method_ == Method::kPullStream ||
                 method_ == Method::kStatus;
    if (unary) return finish(Status(StatusCode::INTERNAL, "the call carried no request"));
    finish(Status::OK);
  }

  void on_message() {
    if (!refusal_.ok()) return finish(refusal_);
    switch (method_) {
      case Method::kEcho:
      case Method::kEchoStream: {
        shared_->add(1, static_cast<int64_t>(request_.Length()));
        shared_->delay();
        if (protobuf_) {
          Status status = check_tensor(request_);
          if (!status.ok()) return finish(status);
        }
        if (method_ == Method::kEcho) return reply_and_finish(request_);
        return write(request_);
      }
      case Method::kPush: {
        shared_->delay();
        if (protobuf_) {
          Status status = check_tensor(request_);
          if (!status.ok()) return finish(status);
        }
        int64_t size = static_cast<int64_t>(request_.Length());
        shared_->add(1, size);
        return reply_and_finish(to_buffer(encode_ack(size, 1)));
      }
      case Method::kPushStream:
        return on_slice();
      case Method::kPull:
      case Method::kPullStream:
        return on_pull();
      case Method::kStatus:
        return reply_and_finish(to_buffer(status_reply()));
      case Method::kUnknown:
        break;
    }
    finish(Status(StatusCode::INTERNAL, "unreachable"));
  }

  void after_write() {
    if (method_ == Method::kPullStream) {
      if (next_piece_ < pieces_.size()) return write(pieces_[next_piece_++]);
      pieces_.clear();
      return finish(Status::OK);
    }
    read();  // EchoStream, PushStream: the next message
  }

  // PushStream: slices of messages of the announced size; one Ack per whole message.
  void on_slice() {
    uint64_t data_bytes = request_.Length();
    if (protobuf_) {
      ChunkSpan span = chunk_span(request_);
      if (!span.ok) return finish(Status(StatusCode::INVALID_ARGUMENT, "not a TensorChunk"));
      data_bytes = span.length;
      if (received_ == 0) first_ = peek(request_, span.prefix + kPeekBytes).substr(span.prefix);
    }
    received_ += static_cast<int64_t>(data_bytes);
    if (received_ < message_bytes_) return read();
    if (received_ > message_bytes_) {
      return finish(Status(StatusCode::INVALID_ARGUMENT,
                           "slices overran the announced message size: " +
                               std::to_string(received_) + " > " +
                               std::to_string(message_bytes_)));
    }
    if (protobuf_) {
      ContentSpan span = content_span(reinterpret_cast<const uint8_t*>(first_.data()), first_.size());
      if (!span.ok || static_cast<int64_t>(span.offset + span.length) != message_bytes_) {
        return finish(Status(StatusCode::INVALID_ARGUMENT,
                             "TensorProto of " + std::to_string(span.offset + span.length) +
                                 " bytes in a " + std::to_string(message_bytes_) + " B message"));
      }
    }
    ++acked_;
    shared_->add(1, received_);
    shared_->delay();
    int64_t received = received_;
    received_ = 0;
    write(to_buffer(encode_ack(received, acked_)));
  }

  // Pull, PullStream: the encoded tensor, made once per (size, dtype) and kept (only the last).
  void on_pull() {
    shared_->delay();
    std::vector<int64_t> fields = {0, kDtUint8, 0};
    if (!varint_fields(to_string(request_), &fields) || fields[0] < 0) {
      return finish(Status(StatusCode::INVALID_ARGUMENT, "not a PullRequest"));
    }
    int64_t nbytes = fields[0];
    int dtype = static_cast<int>(fields[1]);
    int64_t chunk = fields[2] > 0 ? fields[2] : kDefaultChunkBytes;
    int size = itemsize(dtype);
    if (size == 0) {
      return finish(Status(StatusCode::INVALID_ARGUMENT,
                           "PullRequest with unsupported dtype number " + std::to_string(dtype)));
    }
    if (nbytes % size) dtype = kDtUint8, size = 1;
    grpc::Slice message;
    {
      std::lock_guard<std::mutex> lock(shared_->pull_mutex);
      if (shared_->pull_key != std::make_pair(nbytes, dtype)) {
        std::string content = random_content(static_cast<size_t>(nbytes));
        std::string encoded =
            protobuf_ ? encode_header(dtype, {nbytes / size}, static_cast<uint64_t>(nbytes)) + content
                      : content;
        shared_->pull_cache = grpc::Slice(encoded);
        shared_->pull_key = {nbytes, dtype};
      }
      message = shared_->pull_cache;
    }
    if (method_ == Method::kPull) return reply_and_finish(ByteBuffer(&message, 1));
    size_t total = message.size();
    for (size_t start = 0; start < total; start += static_cast<size_t>(chunk)) {
      size_t end = std::min(total, start + static_cast<size_t>(chunk));
      grpc::Slice piece = message.sub(start, end);
      if (protobuf_) {
        grpc::Slice parts[2] = {grpc::Slice(chunk_prefix(end - start)), piece};
        pieces_.emplace_back(parts, 2);
      } else {
        pieces_.emplace_back(&piece, 1);
      }
    }
    next_piece_ = 0;
    if (pieces_.empty()) return finish(Status::OK);
    write(pieces_[next_piece_++]);
  }

  std::string status_reply() const {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    auto ns = [](const timeval& t) {
      return static_cast<uint64_t>(t.tv_sec) * 1000000000ULL +
             static_cast<uint64_t>(t.tv_usec) * 1000ULL;
    };
    std::string out;
    put_varint_field(&out, 1, static_cast<uint64_t>(getpid()));
    put_len_field(&out, 2, shared_->target);
    put_len_field(&out, 3, shared_->options.fabric);
    put_varint_field(&out, 4, static_cast<uint64_t>(shared_->messages.load()));
    put_varint_field(&out, 5, static_cast<uint64_t>(shared_->bytes.load()));
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
    return out;
  }

  Shared* shared_;
  grpc::ServerCompletionQueue* cq_;
  grpc::GenericServerContext context_;
  grpc::GenericServerAsyncReaderWriter stream_;
  State state_ = State::kRequested;
  Method method_ = Method::kUnknown;
  bool protobuf_ = false;
  Status refusal_;
  ByteBuffer request_;
  int64_t message_bytes_ = -1;  // none announced
  int64_t received_ = 0;
  int64_t acked_ = 0;
  std::string first_;  // the first bytes of a streamed message (its TensorProto header)
  std::vector<ByteBuffer> pieces_;
  size_t next_piece_ = 0;
};

void serve(grpc::ServerCompletionQueue* cq, Shared* shared) {
  // A few calls waiting per queue, so a new stream never waits for one to be requested.
  for (int i = 0; i < 4; ++i) new Call(shared, cq);
  void* tag = nullptr;
  bool ok = false;
  while (cq->Next(&tag, &ok)) static_cast<Call*>(tag)->proceed(ok);
}

int usage_error(const std::string& message) {
  std::cerr << "tfgrpc-native-server: error: " << message << "\n"
            << "usage: tfgrpc-native-server --host HOST [--port N] [--fabric NAME] "
               "[--delay-ns N] [--threads N] [--exit-on-stdin-eof]\n";
  return 2;
}

}  // namespace
}  // namespace tfgrpc

int main(int argc, char** argv) {
  using namespace tfgrpc;
  auto shared = std::make_unique<Shared>();
  Options& options = shared->options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--exit-on-stdin-eof") {
      options.exit_on_stdin_eof = true;
      continue;
    }
    if (i + 1 >= argc) return usage_error(arg + " needs a value");
    const char* v = argv[++i];
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
    } else if (arg == "--threads") {
      long threads = std::strtol(v, &end, 10);
      if (*end || threads < 1 || threads > 64) return usage_error("--threads " + std::string(v));
      options.threads = static_cast<int>(threads);
    } else {
      return usage_error("unknown argument " + arg);
    }
  }

  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::string tls_mode;
  try {
    Tls tls = Tls::from_env();
    credentials = tls.server_credentials();
    tls_mode = tls.mode();
  } catch (const TlsError& error) {
    std::cerr << "tfgrpc-native-server: error: TLS settings: " << error.what() << "\n";
    return 2;
  }
  grpc::ServerBuilder builder;
  int bound = 0;
  builder.AddListeningPort(options.host + ":" + std::to_string(options.port), credentials, &bound);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  set_arguments([&builder](const char* key, int value) { builder.AddChannelArgument(key, value); });
  // As the Python server: never share a port with another server.
  builder.AddChannelArgument("grpc.so_reuseport", 0);
  builder.RegisterAsyncGenericService(&shared->service);
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues;
  for (int i = 0; i < options.threads; ++i) queues.push_back(builder.AddCompletionQueue());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound == 0) {
    std::cerr << "tfgrpc-native-server: error: cannot bind " << options.host << ":"
              << options.port << "\n";
    return 1;
  }
  shared->target = options.host + ":" + std::to_string(bound);
  std::vector<std::thread> threads;
  for (auto& cq : queues) threads.emplace_back(serve, cq.get(), shared.get());
  std::printf(
      "{\"target\": \"%s\", \"pid\": %d, \"fabric\": \"%s\", \"engine\": \"native\", "
      "\"tls\": \"%s\"}\n",
      shared->target.c_str(), static_cast<int>(getpid()), options.fabric.c_str(), tls_mode.c_str());
  std::fflush(stdout);
  if (options.exit_on_stdin_eof) {
    char buffer[4096];
    while (read(0, buffer, sizeof buffer) > 0) {
    }
  } else {
    for (;;) pause();  // until a signal ends the process
  }
  {
    std::lock_guard<std::mutex> lock(shared->shutdown_mutex);
    shared->shutting_down = true;
  }
  server->Shutdown(std::chrono::system_clock::now());
  for (auto& cq : queues) cq->Shutdown();
  for (auto& thread : threads) thread.join();
  return 0;
}
