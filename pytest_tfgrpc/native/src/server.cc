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
// It also serves tfgrpc.ParameterServer and its raw twin (ps.h), as the Python tensor server
// does, so a native PS task is this server started with the run's job token.
//
// Every request is bounded before it costs anything: tensors over --max-tensor-bytes (default
// $TFGRPC_MAX_TENSOR_BYTES, else gRPC's message limit less 64 B of framing) are refused with
// RESOURCE_EXHAUSTED, as the Python server refuses them, including a pull's size before the
// tensor is made; streamed replies are cut into slices as they are written, never all at once.
//
// It binds the one host:port it is given, prints {"target", "pid", "fabric"} as one JSON
// line once it serves, and with --exit-on-stdin-eof stops when its stdin closes.
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "ps.h"
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

// Seeded pseudo-random bytes, written in place: tensor content nothing on the path can
// compress away.
void fill_random(uint8_t* out, size_t nbytes) {
  uint64_t state = 20180401;
  for (size_t i = 0; i < nbytes; i += 8) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    std::memcpy(out + i, &state, std::min<size_t>(8, nbytes - i));
  }
}

struct Options {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string fabric = "lo";
  int64_t delay_ns = 0;
  int threads = 1;
  bool exit_on_stdin_eof = false;
  int64_t max_tensor_bytes = kMaxTensorBytes;
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
  ParameterServer ps;

  void add(int64_t m, int64_t b) {
    messages.fetch_add(m, std::memory_order_relaxed);
    bytes.fetch_add(b, std::memory_order_relaxed);
  }
  void delay() const {
    if (options.delay_ns > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(options.delay_ns));
  }
};

enum class Method {
  kUnknown,
  kEcho,
  kEchoStream,
  kPush,
  kPushStream,
  kPull,
  kPullStream,
  kStatus,
  kConfigure,
  kJobStats,
  kThroughput,
  kPushGradients,
  kPullWeights,
};

bool ps_method(Method method) { return method >= Method::kConfigure; }

Method parse_method(const std::string& path, bool* protobuf) {
  static const std::map<std::string, Method> ps_names = {
      {"Configure", Method::kConfigure},         {"JobStats", Method::kJobStats},
      {"Throughput", Method::kThroughput},       {"PushGradients", Method::kPushGradients},
      {"PullWeights", Method::kPullWeights}};
  for (const char* prefix : {kPsService, kRawPsService}) {
    size_t length = std::strlen(prefix);
    if (path.compare(0, length, prefix) != 0) continue;
    *protobuf = prefix == kPsService;
    auto it = ps_names.find(path.substr(length));
    if (it == ps_names.end() || (!*protobuf && it->second != Method::kThroughput)) {
      return Method::kUnknown;  // the raw twin serves Throughput only
    }
    return it->second;
  }
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
  // By subtraction: a content length near 2^64 must not wrap into a match.
  if (span.offset > message.Length() || span.length != message.Length() - span.offset) {
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
      case State::kWaiting:
        // The barrier's alarm: ok when it expired, not ok when a push or a new job woke it.
        return after_wait(ok);
      case State::kFinishing:
        return finished();
    }
  }

 private:
  enum class State { kRequested, kReading, kWriting, kWaiting, kFinishing };

  void respawn() {
    std::lock_guard<std::mutex> lock(shared_->shutdown_mutex);
    if (!shared_->shutting_down) new Call(shared_, cq_);
  }

  void start() {
    method_ = parse_method(context_.method(), &protobuf_);
    if (method_ == Method::kUnknown) {
      return finish(Status(StatusCode::UNIMPLEMENTED, "no method " + context_.method()));
    }
    if (ps_method(method_)) {
      // Before any work, and before the request is even read.
      Status status = shared_->ps.authorize(context_);
      if (!status.ok()) return finish(status);
    }
    if (method_ == Method::kPushStream) {
      const auto& metadata = context_.client_metadata();
      auto found = metadata.find(kMessageBytesKey);
      if (found != metadata.end()) {
        std::string text(found->second.data(), found->second.size());
        char* end = nullptr;
        errno = 0;
        long long value = std::strtoll(text.c_str(), &end, 10);
        if (!text.empty() && *end == '\0' && errno == 0) message_bytes_ = value;
      }
      if (message_bytes_ < 0) {  // 0 B is a message too (an empty tensor), as in Python
        // Refused after the first message, as the Python server does: a client whose write
        // is still under way gets this status rather than a failed write.
        refusal_ = Status(StatusCode::INVALID_ARGUMENT,
                          std::string("a stream must announce its message size in '") +
                              kMessageBytesKey + "' metadata");
      } else if (message_bytes_ > limit() + kFramingBytes) {
        // Read and dropped up to what was announced (at most kDrainBytes), then refused.
        refusal_ = shared_->ps.too_large(message_bytes_, "a pushed message");
        drain_ = std::min<int64_t>(message_bytes_, kDrainBytes);
      }
    }
    read();
  }

  int64_t limit() const { return shared_->options.max_tensor_bytes; }

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
    if (!refusal_.ok()) return finish(refusal_);
    if (method_ == Method::kPushGradients) return commit_push();
    bool streaming_in = method_ == Method::kEchoStream || method_ == Method::kPushStream;
    if (!streaming_in) return finish(Status(StatusCode::INTERNAL, "the call carried no request"));
    finish(Status::OK);
  }

  // A unary request over the limit (with `framing` bytes of message around the tensor).
  bool over_limit(const char* what, int64_t framing) {
    int64_t size = static_cast<int64_t>(request_.Length());
    if (size <= limit() + framing) return false;
    finish(shared_->ps.too_large(size, what));
    return true;
  }

  void on_message() {
    if (!refusal_.ok()) {
      drained_ += static_cast<int64_t>(request_.Length());
      if (drained_ < drain_) return read();
      return finish(refusal_);
    }
    int64_t framing = protobuf_ ? kFramingBytes : 0;
    switch (method_) {
      case Method::kEcho:
      case Method::kEchoStream: {
        if (over_limit("an echoed message", framing)) return;
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
        if (over_limit("a pushed message", framing)) return;
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
      case Method::kConfigure: {
        if (over_limit("a job", kFramingBytes)) return;
        std::string reply;
        Status status = shared_->ps.configure(to_string(request_), &reply);
        if (!status.ok()) return finish(status);
        return reply_and_finish(to_buffer(reply));
      }
      case Method::kJobStats: {
        std::shared_ptr<Job> job = shared_->ps.current();
        if (!job) return finish(no_job());
        std::string reply;
        {
          std::lock_guard<std::mutex> lock(shared_->ps.mutex);
          reply = job->stats();
        }
        return reply_and_finish(to_buffer(reply));
      }
      case Method::kThroughput:
        return on_throughput();
      case Method::kPushGradients:
        return on_gradient();
      case Method::kPullWeights:
        return on_pull_weights();
      case Method::kUnknown:
        break;
    }
    finish(Status(StatusCode::INTERNAL, "unreachable"));
  }

  static Status small_slices(int64_t asked) {
    return Status(StatusCode::INVALID_ARGUMENT,
                  "chunk_bytes " + std::to_string(asked) + ": a streamed reply is cut into slices of at least " +
                      std::to_string(kMinChunkBytes) + " B (0: the server's default)");
  }

  static Status no_job() {
    return Status(StatusCode::FAILED_PRECONDITION, "no job configured on this PS");
  }

  void after_write() {
    ByteBuffer piece;
    if (method_ == Method::kPullStream || method_ == Method::kPullWeights) {
      if (next_piece(&piece)) return write(piece);
      return end_of_pieces();
    }
    read();  // EchoStream, PushStream: the next message
  }

  // --- streamed replies, cut as they are written ----------------------------------------------
  // Slices of sources_[i] of at most chunk_ bytes each, wrapped by the method's framing.
  bool next_piece(ByteBuffer* out) {
    while (source_ < sources_.size() && offset_ >= sources_[source_].size()) {
      ++source_;
      offset_ = 0;
    }
    if (source_ >= sources_.size()) return false;
    const grpc::Slice& source = sources_[source_];
    size_t end = offset_ + std::min<size_t>(static_cast<size_t>(chunk_), source.size() - offset_);
    grpc::Slice piece = source.sub(offset_, end);
    std::string head;
    if (method_ == Method::kPullWeights) {
      head = weight_chunk_head(static_cast<int64_t>(source_), static_cast<int64_t>(offset_),
                               pull_step_, end - offset_);
    } else if (protobuf_) {
      head = chunk_prefix(end - offset_);
    }
    if (head.empty()) {
      *out = ByteBuffer(&piece, 1);
    } else {
      grpc::Slice parts[2] = {grpc::Slice(head), piece};
      *out = ByteBuffer(parts, 2);
    }
    sent_ += static_cast<int64_t>(end - offset_);
    offset_ = end;
    return true;
  }

  void start_pieces() {
    ByteBuffer piece;
    if (next_piece(&piece)) return write(piece);
    end_of_pieces();
  }

  void end_of_pieces() {
    sources_.clear();
    if (method_ == Method::kPullWeights && pull_measured_ && pull_step_ >= 0) {
      std::lock_guard<std::mutex> lock(shared_->ps.mutex);
      job_->bytes_out += sent_;
      job_->rpcs += 1;
    }
    finish(Status::OK);
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
    // data_bytes is at most one received message (< 2 GiB): no overflow below.
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
      uint64_t whole = static_cast<uint64_t>(message_bytes_);
      if (!span.ok || span.offset > whole || span.length != whole - span.offset) {
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
    // Before anything is allocated: 7 bytes of request must not cost a terabyte.
    if (nbytes > limit()) return finish(shared_->ps.too_large(nbytes, "a pull"));
    int dtype = static_cast<int>(fields[1]);
    if (fields[2] != 0 && fields[2] < kMinChunkBytes) return finish(small_slices(fields[2]));
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
        shared_->pull_cache = grpc::Slice();  // the old tensor goes before the new one comes
        std::string header =
            protobuf_ ? encode_header(dtype, {nbytes / size}, static_cast<uint64_t>(nbytes)) : "";
        // One allocation of the whole message, filled in place.
        grpc::Slice encoded(header.size() + static_cast<size_t>(nbytes));
        uint8_t* out = const_cast<uint8_t*>(encoded.begin());
        std::memcpy(out, header.data(), header.size());
        fill_random(out + header.size(), static_cast<size_t>(nbytes));
        shared_->pull_cache = encoded;
        shared_->pull_key = {nbytes, dtype};
      }
      message = shared_->pull_cache;
    }
    if (method_ == Method::kPull) return reply_and_finish(ByteBuffer(&message, 1));
    sources_ = {message};
    chunk_ = chunk;
    start_pieces();
  }

  // --- the PS service ---------------------------------------------------------------------------
  void on_throughput() {
    int64_t size = static_cast<int64_t>(request_.Length());
    if (over_limit("a Throughput payload", protobuf_ ? kFramingBytes : 0)) return;
    if (protobuf_) {
      Status status = check_tensor(request_);
      if (!status.ok()) return finish(status);
      std::string head = peek(request_, kPeekBytes);
      size = static_cast<int64_t>(
          content_span(reinterpret_cast<const uint8_t*>(head.data()), head.size()).length);
    }
    const auto& metadata = context_.client_metadata();
    auto phase = metadata.find(kPhaseKey);
    bool measured = phase != metadata.end() && phase->second == kMeasure;
    if (measured) {
      ParameterServer& ps = shared_->ps;
      std::lock_guard<std::mutex> lock(ps.mutex);
      if (ps.job) {
        ps.job->start_measuring();
        ps.job->rpcs += 1;
        ps.job->bytes_in += size;
      }
    }
    reply_and_finish(to_buffer(encode_ack(static_cast<int64_t>(request_.Length()), 1)));
  }

  // PushGradients: the first chunk names step, worker and phase; every chunk after it must
  // continue the push in order (shard by shard, offset by offset), and is staged in the call.
  // A chunk in several slices is parsed where it lies and its data copied once, into the
  // staging buffer (not first into one contiguous copy).
  void on_gradient() {
    grpc::Slice single;
    std::vector<grpc::Slice> slices;
    std::string head, tail;
    size_t data_at = 0;
    WeightChunk chunk;
    bool parsed = false;
    if (request_.TrySingleSlice(&single).ok()) {
      parsed = parse_chunk(single.begin(), single.size(), &chunk);
    } else if (request_.Dump(&slices).ok()) {
      head = peek(request_, kPeekBytes);
      parsed = parse_chunk_in_place(slices, request_.Length(), head, &tail, &chunk, &data_at);
      if (!parsed) {  // an unusual layout (the data field late): parsed whole, as one copy
        chunk = WeightChunk();
        head = to_string(request_);
        parsed = parse_chunk(reinterpret_cast<const uint8_t*>(head.data()), head.size(), &chunk);
      }
    }
    if (!parsed) return finish(Status(StatusCode::INVALID_ARGUMENT, "not a WeightChunk"));
    if (!job_) {
      job_ = shared_->ps.current();
      if (!job_) return finish(no_job());
      ParameterServer& ps = shared_->ps;
      std::lock_guard<std::mutex> lock(ps.mutex);
      push_step_ = chunk.step;
      push_worker_ = chunk.worker;
      push_measured_ = chunk.measured;
      if (!accepts_push()) return finish(out_of_turn());
      staged_ = job_->take_staging();  // every byte is written before the commit reads it
    }
    if (chunk.length == 0) return read();
    const std::vector<int64_t>& sizes = job_->sizes;
    while (shard_ < sizes.size() && cursor_ >= sizes[shard_]) {
      ++shard_;
      cursor_ = 0;
    }
    if (shard_ >= sizes.size() || chunk.shard != static_cast<int64_t>(shard_) ||
        chunk.offset != cursor_ || chunk.length % 4 ||
        chunk.length > static_cast<uint64_t>(sizes[shard_] - cursor_)) {
      return finish(Status(
          StatusCode::INVALID_ARGUMENT,
          "a gradient slice (" + std::to_string(chunk.length) + " B at " +
              std::to_string(chunk.offset) + " of shard " + std::to_string(chunk.shard) +
              ") does not continue the push: slices must cover this PS's shards in order, "
              "float32-aligned"));
    }
    auto* to = reinterpret_cast<uint8_t*>(staged_.get() + job_->bases[shard_] + cursor_ / 4);
    if (chunk.data != nullptr) {
      std::memcpy(to, chunk.data, chunk.length);
    } else if (!copy_range(slices, data_at, chunk.length, to)) {
      return finish(Status(StatusCode::INVALID_ARGUMENT, "not a WeightChunk"));
    }
    cursor_ += static_cast<int64_t>(chunk.length);
    pushed_ += static_cast<int64_t>(chunk.length);
    read();
  }

  // Under the PS lock: this push's step is the one being pushed, by a worker of the job that
  // has not pushed it yet. Checked at the first chunk and again when committing.
  bool accepts_push() const {
    const Job& job = *job_;
    return push_step_ == job.step && push_worker_ >= 0 && push_worker_ < job.spec.workers &&
           job.pushed.count(push_worker_) == 0;
  }

  Status out_of_turn() const {
    return Status(StatusCode::FAILED_PRECONDITION,
                  "worker " + std::to_string(push_worker_) + "'s push of step " +
                      std::to_string(push_step_) +
                      " is out of turn: not the step this PS takes now, a worker index outside "
                      "the job, or a step that worker already pushed");
  }

  // The whole push arrived: add it to the aggregate, or refuse it without touching the sum.
  void commit_push() {
    if (!job_) return finish(Status(StatusCode::INVALID_ARGUMENT, "an empty gradient push"));
    if (pushed_ != job_->total_bytes) {
      return finish(Status(StatusCode::INVALID_ARGUMENT,
                           "worker " + std::to_string(push_worker_) + " pushed " +
                               std::to_string(pushed_) + " B of gradients for step " +
                               std::to_string(push_step_) + "; this PS owns " +
                               std::to_string(job_->total_bytes) + " B"));
    }
    ParameterServer& ps = shared_->ps;
    {
      std::lock_guard<std::mutex> lock(ps.mutex);
      if (ps.job != job_) return finish(Status(StatusCode::ABORTED, "the job was replaced during the push"));
      if (!accepts_push()) return finish(out_of_turn());
      Job& job = *job_;
      for (size_t s = 0; s < job.accumulators.size(); ++s) {
        std::vector<float>& sum = job.accumulators[s];
        const float* add = staged_.get() + job.bases[s];
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += add[i];
      }
      job.pushed.insert(push_worker_);
      if (push_measured_) {
        job.start_measuring();
        job.step_measured = true;
        job.bytes_in += pushed_;
        job.rpcs += 1;
      }
      if (static_cast<int64_t>(job.pushed.size()) == job.spec.workers) {
        job.apply();
        ps.wake();
      }
      job.spare.push_back(std::move(staged_));
    }
    reply_and_finish(to_buffer(encode_ack(pushed_, 1)));
  }

  // PullWeights: wait at the barrier for the step's update (parked on an alarm, no thread
  // held), then stream the weights.
  void on_pull_weights() {
    std::vector<int64_t> fields = {0, 0, 0, 0};
    if (!varint_fields(to_string(request_), &fields)) {
      return finish(Status(StatusCode::INVALID_ARGUMENT, "not a PullWeightsRequest"));
    }
    pull_step_ = fields[0];
    pull_measured_ = fields[2] != 0;
    if (fields[3] != 0 && fields[3] < kMinChunkBytes) return finish(small_slices(fields[3]));
    chunk_ = fields[3] > 0 ? fields[3] : kDefaultPullChunk;
    job_ = shared_->ps.current();
    if (!job_) return finish(no_job());
    ParameterServer& ps = shared_->ps;
    std::unique_lock<std::mutex> lock(ps.mutex);
    if (pull_step_ < 0) {
      sources_ = job_->served;
      lock.unlock();
      return start_pieces();
    }
    if (pull_step_ > job_->step) {
      return finish(Status(StatusCode::FAILED_PRECONDITION,
                           "pull of step " + std::to_string(pull_step_) +
                               " before this PS took its pushes"));
    }
    double timeout = job_->spec.barrier_timeout_seconds;
    if (!(timeout > 0)) timeout = 0;
    timeout = std::min(timeout, 86400.0);
    deadline_ = std::chrono::system_clock::now() +
                std::chrono::microseconds(static_cast<int64_t>(timeout * 1e6));
    if (job_->step > pull_step_) return pull_ready(lock);
    if (ps.stopping) return finish(Status(StatusCode::UNAVAILABLE, "the PS is shutting down"));
    state_ = State::kWaiting;
    ps.waiting.insert(&alarm_);
    alarm_.Set(cq_, deadline_, this);
  }

  void after_wait(bool expired) {
    ParameterServer& ps = shared_->ps;
    std::unique_lock<std::mutex> lock(ps.mutex);
    ps.waiting.erase(&alarm_);
    if (ps.job != job_) return finish(Status(StatusCode::ABORTED, "the job was replaced"));
    if (job_->step > pull_step_) return pull_ready(lock);
    if (ps.stopping) return finish(Status(StatusCode::UNAVAILABLE, "the PS is shutting down"));
    if (expired || std::chrono::system_clock::now() >= deadline_) {
      double timeout = job_->spec.barrier_timeout_seconds;
      return finish(Status(StatusCode::DEADLINE_EXCEEDED,
                           "step " + std::to_string(pull_step_) + ": " +
                               std::to_string(job_->pushed.size()) + " of " +
                               std::to_string(job_->spec.workers) +
                               " workers pushed their gradients within " + format_seconds(timeout) +
                               " s"));
    }
    state_ = State::kWaiting;  // woken for another reason: park again until the deadline
    ps.waiting.insert(&alarm_);
    alarm_.Set(cq_, deadline_, this);
  }

  // Under the PS lock: the step was applied.
  void pull_ready(std::unique_lock<std::mutex>& lock) {
    if (job_->step != pull_step_ + 1) {
      return finish(Status(StatusCode::FAILED_PRECONDITION,
                           "pull of step " + std::to_string(pull_step_) +
                               ", a step this PS has applied and moved past"));
    }
    if (job_->spec.task == 0) {
      context_.AddTrailingMetadata(kNextPhaseKey, job_->next_phase[pull_step_]);
    }
    sources_ = job_->served;
    lock.unlock();
    start_pieces();
  }

  static std::string format_seconds(double seconds) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", seconds);
    return text;
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
    std::string limit;
    put_len_field(&limit, 1, "max_tensor_bytes");
    put_len_field(&limit, 2, std::to_string(shared_->options.max_tensor_bytes));
    put_len_field(&out, 9, limit);
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
  int64_t drain_ = 0;    // an over-limit push: bytes read and dropped before the refusal
  int64_t drained_ = 0;
  // A streamed reply: the sources, where the next slice starts, the slice size, bytes sent.
  std::vector<grpc::Slice> sources_;
  size_t source_ = 0;
  size_t offset_ = 0;
  int64_t chunk_ = kDefaultChunkBytes;
  int64_t sent_ = 0;
  // The PS service: the job a call works on, a push's header, cursor and staged gradients,
  // a pull's step and the alarm it waits on at the barrier.
  std::shared_ptr<Job> job_;
  int64_t push_step_ = 0;
  int64_t push_worker_ = 0;
  bool push_measured_ = false;
  size_t shard_ = 0;
  int64_t cursor_ = 0;
  int64_t pushed_ = 0;
  std::unique_ptr<float[]> staged_;
  int64_t pull_step_ = 0;
  bool pull_measured_ = false;
  std::chrono::system_clock::time_point deadline_;
  grpc::Alarm alarm_;
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
               "[--delay-ns N] [--threads N] [--max-tensor-bytes N] [--exit-on-stdin-eof]\n";
  return 2;
}

}  // namespace
}  // namespace tfgrpc

int main(int argc, char** argv) {
  using namespace tfgrpc;
  auto shared = std::make_unique<Shared>();
  Options& options = shared->options;
  if (const char* limit = std::getenv("TFGRPC_MAX_TENSOR_BYTES"); limit && *limit) {
    char* end = nullptr;
    options.max_tensor_bytes = std::strtoll(limit, &end, 10);
    if (*end || options.max_tensor_bytes < 0 || options.max_tensor_bytes > kMaxTensorBytes) {
      return usage_error(std::string("$TFGRPC_MAX_TENSOR_BYTES=") + limit +
                         ": the native server takes a number of bytes from 0 to " +
                         std::to_string(kMaxTensorBytes));
    }
  }
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
    } else if (arg == "--max-tensor-bytes") {
      options.max_tensor_bytes = std::strtoll(v, &end, 10);
      if (*end || options.max_tensor_bytes < 0 || options.max_tensor_bytes > kMaxTensorBytes) {
        return usage_error("--max-tensor-bytes " + std::string(v) + ": a number of bytes from 0 to " +
                           std::to_string(kMaxTensorBytes));
      }
    } else if (arg == "--threads") {
      long threads = std::strtol(v, &end, 10);
      if (*end || threads < 1 || threads > 64) return usage_error("--threads " + std::string(v));
      options.threads = static_cast<int>(threads);
    } else {
      return usage_error("unknown argument " + arg);
    }
  }

  shared->ps.max_tensor_bytes = options.max_tensor_bytes;
  if (const char* token = std::getenv(kTokenEnv)) shared->ps.token = token;
  unsetenv(kTokenEnv);  // nothing this process starts needs it

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
  shared->ps.stop();
  server->Shutdown(std::chrono::system_clock::now());
  for (auto& cq : queues) cq->Shutdown();
  for (auto& thread : threads) thread.join();
  return 0;
}
