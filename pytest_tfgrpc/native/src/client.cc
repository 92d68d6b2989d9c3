// tfgrpc-native-client: the measuring loops of pytest_tfgrpc/bench/p2p.py in C++.
//
// One run measures one message size against one server: warm-up (bounded in count and
// time), then one sample per operation until the iteration count or the time limit runs out,
// as bench/timing.py's measure() does. --streams N runs N such loops at once, each on its own
// channel (own connection: a local subchannel pool and a distinct channel argument), their
// measured phases started together after every warm-up, as OSU multi-pair and iperf -P do.
//
// Every sample goes to stdout as int64 nanoseconds in the binary form read by
// pytest_tfgrpc/native/client.py (format below). Errors go to stderr; exit status 2 is a
// usage error, 3 a failed or wrong RPC, 4 its parent went away (--exit-on-stdin-eof).
//
// --pause-fd N (a socket its parent holds the other end of): the client writes a line there
// once every stream is connected and warm ("s"), and once every measured loop has ended
// ("e", before any connection closes): the phase's letter; " w<ns>", its threads' run-queue
// wait so far (run_queue.h; absent where it cannot be read); " r<ns>", what making this
// line took (the telemetry's cost in this process, with the listing of the status channel's
// connection before the first pause); then the measured connections' ends,
// " local>peer" each (address:port, [v6]:port: the streams' connections, not the status
// channel's), and each time waits for one byte back before going on, so that the parent can
// read those connections' TCP state (sock_diag, by their exact addresses: no walk of the
// kernel's connection table) at the measured phase's start and end. Its parent gone (end of
// file there): exit status 4.
//
// Output (little-endian): "TFGN", u32 version (1), u32 streams; i64 size_bytes, wire_bytes,
// wall_ns (first measured start to last measured end), client_user_ns, client_system_ns,
// server_user_ns, server_system_ns (over the measured phase); then per stream: i64 count,
// i64 elapsed_ns, i64 start_ns (after the first stream's start), count x i64 samples.
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/sync_stream.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "call.h"
#include "ends.h"
#include "run_queue.h"
#include "tls.h"
#include "wire.h"

namespace tfgrpc {
namespace {

using grpc::ByteBuffer;
using grpc::ClientContext;
using grpc::Slice;
using grpc::internal::RpcMethod;

struct Settings {
  std::string target;
  std::string benchmark;  // latency | bandwidth
  std::string mode = "raw";
  std::string rpc = "unary";
  std::string direction = "push";
  int64_t size = -1;
  int dtype = kDtFloat;
  int64_t iterations = 0;
  int64_t warmup = 0;
  double max_seconds = 0;
  double warmup_seconds = 0;
  int64_t chunk_bytes = kDefaultChunkBytes;
  double deadline_s = 0;
  int streams = 1;
  int pause_fd = -1;
  // Of the TLS setting its parent handed it ($TFGRPC_TLS_*, tls.h); plaintext by default.
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  std::string tls_mode = "off";
};

std::shared_ptr<grpc::Channel> connect(const Settings& s, int stream) {
  const std::string& target = s.target;
  grpc::ChannelArguments args;
  common_arguments(&args);
  // Each stream its own connection: gRPC folds channels with equal arguments into one
  // subchannel unless the pool is local, and the stream index keeps the arguments distinct.
  args.SetInt("grpc.use_local_subchannel_pool", 1);
  args.SetInt("tfgrpc.stream", stream);
  auto channel = grpc::CreateCustomChannel(target, s.credentials, args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    std::string why = s.tls_mode == "off"
                          ? ""
                          : " (TLS " + s.tls_mode +
                                " on this side: a failed handshake looks the same: a server "
                                "certificate its CA did not sign, or a server that requires a "
                                "client certificate this side lacks)";
    throw CallError("no connection to " + target + " within 10 s" + why);
  }
  return channel;
}

ByteBuffer buffer_of(std::vector<Slice> slices) {
  return ByteBuffer(slices.data(), slices.size());
}

class Tensor {
 public:
  Tensor(const Settings& s) : settings_(s), content_(make_content(s.size)) {
    int itemsize = s.dtype == kDtFloat ? 4 : 1;
    shape_ = {s.size / itemsize};
  }
  int64_t nbytes() const { return settings_.size; }
  int64_t wire_bytes() const {
    if (settings_.mode == "raw") return nbytes();
    return static_cast<int64_t>(header().size()) + nbytes();
  }
  std::string header() const {
    return encode_header(settings_.dtype, shape_, static_cast<uint64_t>(nbytes()));
  }
  // One message as the benchmark sends it; in protobuf mode the header is encoded now (in
  // the timed region, as the Python engine does), the content is the tensor's own buffer.
  ByteBuffer message() const {
    if (settings_.mode == "raw") return buffer_of({content_});
    return buffer_of({Slice(header()), content_});
  }
  // The messages of one streamed push (TensorChunk slices in protobuf mode), slices made
  // once: `first` needs the header in front of it for every send.
  std::vector<ByteBuffer> rest_chunks() const {
    std::vector<ByteBuffer> out;
    size_t chunk = static_cast<size_t>(settings_.chunk_bytes);
    size_t total = content_.size();
    for (size_t start = chunk; start < total; start += chunk) {
      Slice piece = content_.sub(start, std::min(total, start + chunk));
      if (settings_.mode == "raw") {
        out.push_back(buffer_of({piece}));
      } else {
        out.push_back(buffer_of({Slice(chunk_prefix(piece.size())), piece}));
      }
    }
    return out;
  }
  ByteBuffer first_chunk() const {
    size_t end = std::min(content_.size(), static_cast<size_t>(settings_.chunk_bytes));
    Slice piece = content_.sub(0, end);
    if (settings_.mode == "raw") return buffer_of({piece});
    std::string head = header();
    std::string prefix = chunk_prefix(head.size() + piece.size()) + head;
    return buffer_of({Slice(prefix), piece});
  }
  // The tensor content a protobuf message carries, or the raw bytes: (length, equal?).
  bool same_content(const ByteBuffer& reply) const {
    std::string got = to_string(reply);
    size_t offset = 0;
    if (settings_.mode == "protobuf") {
      ContentSpan span = content_span(reinterpret_cast<const uint8_t*>(got.data()), got.size());
      if (!span.ok || span.offset + span.length != got.size()) return false;
      offset = span.offset;
    }
    return got.size() - offset == content_.size() &&
           std::memcmp(got.data() + offset, content_.begin(), content_.size()) == 0;
  }

 private:
  const Settings& settings_;
  Slice content_;
  std::vector<int64_t> shape_;
};

uint64_t tensor_length(const ByteBuffer& reply) {
  std::string head = peek(reply, kPeekBytes);
  ContentSpan span = content_span(reinterpret_cast<const uint8_t*>(head.data()), head.size());
  if (!span.ok || span.offset + span.length != reply.Length()) {
    throw CallError("the reply is not a whole TensorProto");
  }
  return span.length;
}

int64_t acked_bytes(const ByteBuffer& reply) {
  std::vector<int64_t> fields = {0, 0};
  if (!varint_fields(to_string(reply), &fields)) throw CallError("the reply is not an Ack");
  return fields[0];
}

void check_ack(int64_t acked, int64_t wire) {
  if (acked != wire) {
    throw CallError("the server acknowledged " + std::to_string(acked) + " B of a " +
                    std::to_string(wire) + " B push");
  }
}

// One benchmark operation on one channel: prepared (untimed: open the call, check one
// answer), then timed again and again, then finished (untimed: close the call).
class Operation {
 public:
  Operation(const Settings& s, std::shared_ptr<grpc::Channel> c, const Tensor& t,
            const char* name, RpcMethod::RpcType type, const char* what)
      : s_(s), channel_(std::move(c)), tensor_(t),
        method_(interned(method_path(s.mode, name)), type, channel_), what_(what) {}
  virtual ~Operation() = default;
  virtual void prepare() = 0;
  virtual void run() = 0;
  virtual void finish() {
    if (stream_) close_stream();
  }

 protected:
  ByteBuffer unary(const ByteBuffer& request) {
    ClientContext context;
    set_deadline(&context, s_.deadline_s);
    ByteBuffer reply;
    check(grpc::internal::BlockingUnaryCall(channel_.get(), method_, &context, request, &reply),
          what_);
    return reply;
  }
  // A bidirectional stream for the whole run; `message_bytes` announced if given.
  void open_stream(const std::string& message_bytes = "") {
    set_deadline(&context_, s_.deadline_s);
    if (!message_bytes.empty()) context_.AddMetadata(kMessageBytesKey, message_bytes);
    stream_.reset(grpc::internal::ClientReaderWriterFactory<ByteBuffer, ByteBuffer>::Create(
        channel_.get(), method_, &context_));
  }
  void close_stream() {
    stream_->WritesDone();
    check(stream_->Finish(), what_);
  }
  // A write or read failed: the stream's status says why.
  [[noreturn]] void stream_ended() {
    close_stream();
    throw CallError(std::string(what_) + " failed: the server ended the stream");
  }
  ByteBuffer read_reply() {
    ByteBuffer reply;
    if (!stream_->Read(&reply)) stream_ended();
    return reply;
  }

  const Settings& s_;
  std::shared_ptr<grpc::Channel> channel_;
  const Tensor& tensor_;
  RpcMethod method_;
  const char* what_;
  ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<ByteBuffer, ByteBuffer>> stream_;
};

// Echo and EchoStream: one round trip per operation.
class Echo : public Operation {
 public:
  Echo(const Settings& s, std::shared_ptr<grpc::Channel> c, const Tensor& t)
      : Operation(s, std::move(c), t, s.rpc == "unary" ? "Echo" : "EchoStream",
                  s.rpc == "unary" ? RpcMethod::NORMAL_RPC : RpcMethod::BIDI_STREAMING,
                  s.rpc == "unary" ? "unary echo" : "stream echo") {}
  void prepare() override {
    if (s_.rpc == "stream") open_stream();
    ByteBuffer reply = exchange();
    if (!tensor_.same_content(reply)) {
      throw CallError(std::string("the ") + what_ + " of a " + std::to_string(tensor_.nbytes()) +
                      " B tensor came back different (" + std::to_string(reply.Length()) + " B)");
    }
  }
  void run() override {
    ByteBuffer reply = exchange();
    if (s_.mode == "protobuf") tensor_length(reply);
  }

 private:
  ByteBuffer exchange() {
    if (!stream_) return unary(tensor_.message());
    if (!stream_->Write(tensor_.message())) stream_ended();
    return read_reply();
  }
};

// Push and PushStream: one tensor until its acknowledgement per operation.
class Push : public Operation {
 public:
  Push(const Settings& s, std::shared_ptr<grpc::Channel> c, const Tensor& t)
      : Operation(s, std::move(c), t, s.rpc == "unary" ? "Push" : "PushStream",
                  s.rpc == "unary" ? RpcMethod::NORMAL_RPC : RpcMethod::BIDI_STREAMING,
                  s.rpc == "unary" ? "unary push" : "stream push"),
        rest_(s.rpc == "unary" ? std::vector<ByteBuffer>() : t.rest_chunks()) {}
  void prepare() override {
    if (s_.rpc == "stream") open_stream(std::to_string(tensor_.wire_bytes()));
    check_ack(acked_bytes(push()), tensor_.wire_bytes());
  }
  void run() override { push(); }

 private:
  ByteBuffer push() {
    if (!stream_) return unary(tensor_.message());
    bool ok = stream_->Write(tensor_.first_chunk());
    for (size_t i = 0; ok && i < rest_.size(); ++i) ok = stream_->Write(rest_[i]);
    if (!ok) stream_ended();
    return read_reply();
  }
  std::vector<ByteBuffer> rest_;
};

// Pull and PullStream: one tensor fetched per operation (a call each, as RecvTensor).
class Pull : public Operation {
 public:
  Pull(const Settings& s, std::shared_ptr<grpc::Channel> c, const Tensor& t)
      : Operation(s, std::move(c), t, s.rpc == "unary" ? "Pull" : "PullStream",
                  s.rpc == "unary" ? RpcMethod::NORMAL_RPC : RpcMethod::SERVER_STREAMING,
                  s.rpc == "unary" ? "unary pull" : "stream pull"),
        request_(to_buffer(encode_pull_request(s.size, s.dtype, s.chunk_bytes))) {}
  void prepare() override {
    int64_t got = pull();
    if (got != tensor_.nbytes()) {
      throw CallError("pulled " + std::to_string(got) + " B of tensor content, asked for " +
                      std::to_string(tensor_.nbytes()) + " B");
    }
  }
  void run() override { pull(); }

 private:
  int64_t pull() {
    bool protobuf = s_.mode == "protobuf";
    if (s_.rpc == "unary") {
      ByteBuffer reply = unary(request_);
      return protobuf ? static_cast<int64_t>(tensor_length(reply))
                      : static_cast<int64_t>(reply.Length());
    }
    ClientContext context;
    set_deadline(&context, s_.deadline_s);
    std::unique_ptr<grpc::ClientReader<ByteBuffer>> reader(
        grpc::internal::ClientReaderFactory<ByteBuffer>::Create(channel_.get(), method_, &context,
                                                                request_));
    ByteBuffer piece;
    int64_t total = 0;
    int64_t content = 0;
    bool first = true;
    while (reader->Read(&piece)) {
      if (!protobuf) {
        total += static_cast<int64_t>(piece.Length());
        continue;
      }
      ChunkSpan chunk = chunk_span(piece);
      if (!chunk.ok) throw CallError("a pulled slice is not a TensorChunk");
      if (first) {
        std::string head = peek(piece, chunk.prefix + kPeekBytes).substr(chunk.prefix);
        ContentSpan span =
            content_span(reinterpret_cast<const uint8_t*>(head.data()), head.size());
        if (!span.ok) throw CallError("the first pulled slice has no TensorProto header");
        content = static_cast<int64_t>(span.length);
        first = false;
      }
    }
    check(reader->Finish(), what_);
    return protobuf ? content : total;
  }
  ByteBuffer request_;
};

std::unique_ptr<Operation> make_operation(const Settings& s, std::shared_ptr<grpc::Channel> c,
                                          const Tensor& t) {
  if (s.benchmark == "latency") return std::make_unique<Echo>(s, std::move(c), t);
  if (s.direction == "pull") return std::make_unique<Pull>(s, std::move(c), t);
  return std::make_unique<Push>(s, std::move(c), t);
}

struct StreamResult {
  std::vector<int64_t> samples;
  int64_t start_ns = 0;
  int64_t elapsed_ns = 0;
  std::string error;
};

struct Cpu {
  int64_t user = 0, system = 0, server_user = 0, server_system = 0;
};

Cpu read_cpu(const std::shared_ptr<grpc::Channel>& status_channel) {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  Cpu cpu;
  cpu.user = usage.ru_utime.tv_sec * 1000000000LL + usage.ru_utime.tv_usec * 1000LL;
  cpu.system = usage.ru_stime.tv_sec * 1000000000LL + usage.ru_stime.tv_usec * 1000LL;
  RpcMethod method(interned(method_path("raw", "Status")), RpcMethod::NORMAL_RPC, status_channel);
  ClientContext context;
  set_deadline(&context, 10);
  ByteBuffer reply;
  check(grpc::internal::BlockingUnaryCall(status_channel.get(), method, &context, to_buffer(""),
                                          &reply),
        "server status");
  std::vector<int64_t> fields(7, 0);
  if (!varint_fields(to_string(reply), &fields)) throw CallError("bad ServerStatus reply");
  cpu.server_user = fields[5];
  cpu.server_system = fields[6];
  return cpu;
}

// What the client tells its parent at each pause (--pause-fd), and its wait for the answer.
class Pauses {
 public:
  explicit Pauses(int fd) : fd_(fd) {}

  // The connections open now are not measured ones (the status channel's, made first).
  void exclude_open_ones() {
    if (fd_ < 0) return;
    int64_t began = now_ns();
    for (Connection& connection : connections()) excluded_.insert(std::move(connection.ends));
    spent_ns_ += now_ns() - began;
  }

  // Tell the parent the phase `what` is reached and wait until it has looked.
  void pause(char what) {
    if (fd_ < 0) return;
    int64_t began = now_ns();
    std::string line(1, what), ends;
    // The connections first: the threads' files, once open, are descriptors to pass over.
    for (const Connection& connection : measured()) ends += " " + connection.ends;
    int64_t waited = run_queue_.read();
    if (waited >= 0) line += " w" + std::to_string(waited);
    spent_ns_ += now_ns() - began;
    line += " r" + std::to_string(spent_ns_) + ends + "\n";
    spent_ns_ = 0;
    char answer = 0;
    for (size_t sent = 0; sent < line.size();) {
      ssize_t wrote = ::write(fd_, line.data() + sent, line.size() - sent);
      if (wrote <= 0) std::_Exit(4);
      sent += static_cast<size_t>(wrote);
    }
    if (::read(fd_, &answer, 1) != 1) std::_Exit(4);
  }

 private:
  // The measured connections: those the last pause told, where each descriptor still holds
  // the same connection (two calls each), else every connection not excluded, listed anew.
  const std::vector<Connection>& measured() {
    bool same = !measured_.empty();
    for (const Connection& connection : measured_) {
      if (!same) break;
      same = ends_of(connection.fd) == connection.ends;
    }
    if (!same) {
      measured_.clear();
      for (Connection& connection : connections()) {
        if (!excluded_.count(connection.ends)) measured_.push_back(std::move(connection));
      }
    }
    return measured_;
  }

  int fd_;
  // Telemetry time not yet told (ns): the exclusion's listing, told at the first pause.
  int64_t spent_ns_ = 0;
  std::set<std::string> excluded_;
  std::vector<Connection> measured_;
  RunQueueWait run_queue_;
};

// One stream's warm-up and measured loop, in step with the others through `sync` (four
// phases: every stream warm, the CPU start read, every measured loop ended, the end paused).
void run_stream(const Settings& s, int index, const Tensor& tensor,
                std::barrier<>* sync, std::atomic<bool>* failed, StreamResult* out) {
  bool arrived = false;
  try {
    auto channel = connect(s, index);
    std::unique_ptr<Operation> op = make_operation(s, channel, tensor);
    op->prepare();
    int64_t warm_end = now_ns() + static_cast<int64_t>(s.warmup_seconds * 1e9);
    for (int64_t i = 0; i < s.warmup; ++i) {
      op->run();
      if (now_ns() >= warm_end) break;
    }
    sync->arrive_and_wait();  // every stream warm
    sync->arrive_and_wait();  // the phase's CPU start read
    out->samples.reserve(static_cast<size_t>(s.iterations));
    // Another stream failed its warm-up: the run has failed, so nothing is measured.
    int64_t iterations = failed->load() ? 0 : s.iterations;
    int64_t start = now_ns();
    int64_t deadline = start + static_cast<int64_t>(s.max_seconds * 1e9);
    for (int64_t i = 0; i < iterations; ++i) {
      int64_t t0 = now_ns();
      op->run();
      int64_t t1 = now_ns();
      out->samples.push_back(t1 - t0);
      if (t1 >= deadline) break;
    }
    out->elapsed_ns = now_ns() - start;
    out->start_ns = start;
    sync->arrive_and_wait();  // every measured loop ended
    arrived = true;
    sync->arrive_and_wait();  // the parent has looked at the connections, still open
    op->finish();
  } catch (const std::exception& error) {
    out->error = error.what();
    failed->store(true);  // before its barrier: the others see it once past it
    if (!arrived) sync->arrive_and_drop();
  }
}

void put_i64(std::string* out, int64_t value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof value);  // x86-64/arm64: LE
}

int usage_error(const std::string& message) {
  std::cerr << "tfgrpc-native-client: error: " << message << "\n";
  return 2;
}

int run(const Settings& s) {
  Tensor tensor(s);
  std::shared_ptr<grpc::Channel> status_channel = connect(s, -1);
  Pauses pauses(s.pause_fd);
  pauses.exclude_open_ones();  // the status channel's connection
  std::barrier<> sync(s.streams + 1);
  std::vector<StreamResult> results(static_cast<size_t>(s.streams));
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < s.streams; ++i) {
    threads.emplace_back(run_stream, std::cref(s), i, std::cref(tensor), &sync, &failed,
                         &results[i]);
  }
  sync.arrive_and_wait();
  // A stream that failed its warm-up (a server that stopped answering) ends the run now:
  // neither the pause nor the CPU read, which would wait on that server for its own deadline.
  bool warm = !failed.load();
  if (warm) pauses.pause('s');
  Cpu start{};
  std::string cpu_error;
  try {
    if (warm) start = read_cpu(status_channel);
  } catch (const std::exception& error) {
    cpu_error = error.what();
  }
  sync.arrive_and_wait();
  sync.arrive_and_wait();
  if (warm) pauses.pause('e');
  sync.arrive_and_wait();
  for (auto& thread : threads) thread.join();
  for (const auto& result : results) {
    if (!result.error.empty()) {
      std::cerr << result.error << "\n";
      return 3;
    }
  }
  if (!cpu_error.empty()) {
    std::cerr << cpu_error << "\n";
    return 3;
  }
  Cpu end = read_cpu(status_channel);
  int64_t first = results[0].start_ns, last = 0;
  for (const auto& r : results) {
    first = std::min(first, r.start_ns);
    last = std::max(last, r.start_ns + r.elapsed_ns);
  }
  std::string out = "TFGN";
  uint32_t header[2] = {1, static_cast<uint32_t>(s.streams)};
  out.append(reinterpret_cast<const char*>(header), sizeof header);
  for (int64_t value : {s.size, tensor.wire_bytes(), last - first, end.user - start.user,
                        end.system - start.system, end.server_user - start.server_user,
                        end.server_system - start.server_system}) {
    put_i64(&out, value);
  }
  for (const auto& r : results) {
    put_i64(&out, static_cast<int64_t>(r.samples.size()));
    put_i64(&out, r.elapsed_ns);
    put_i64(&out, r.start_ns - first);
    out.append(reinterpret_cast<const char*>(r.samples.data()), r.samples.size() * 8);
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace tfgrpc

int main(int argc, char** argv) {
  using namespace tfgrpc;
  Settings s;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--exit-on-stdin-eof") {
      // The parent holds our stdin open while it waits: its death (even SIGKILL) ends us.
      std::thread([] {
        char buffer[256];
        while (read(0, buffer, sizeof buffer) > 0) {
        }
        std::_Exit(4);
      }).detach();
      continue;
    }
    if (i + 1 >= argc) return usage_error(arg + " needs a value");
    std::string v = argv[++i];
    char* end = nullptr;
    auto integer = [&](int64_t* field) {
      *field = std::strtoll(v.c_str(), &end, 10);
      return *end == '\0' && !v.empty();
    };
    auto real = [&](double* field) {
      *field = std::strtod(v.c_str(), &end);
      return *end == '\0' && !v.empty();
    };
    bool ok = true;
    int64_t number = 0;
    if (arg == "--target") s.target = v;
    else if (arg == "--benchmark") s.benchmark = v;
    else if (arg == "--mode") s.mode = v;
    else if (arg == "--rpc") s.rpc = v;
    else if (arg == "--direction") s.direction = v;
    else if (arg == "--dtype") {
      if (v == "float32") s.dtype = kDtFloat;
      else if (v == "uint8") s.dtype = kDtUint8;
      else ok = false;
    } else if (arg == "--size") ok = integer(&s.size);
    else if (arg == "--iterations") ok = integer(&s.iterations);
    else if (arg == "--warmup") ok = integer(&s.warmup);
    else if (arg == "--max-seconds") ok = real(&s.max_seconds);
    else if (arg == "--warmup-seconds") ok = real(&s.warmup_seconds);
    else if (arg == "--chunk-bytes") ok = integer(&s.chunk_bytes);
    else if (arg == "--deadline-s") ok = real(&s.deadline_s);
    else if (arg == "--pause-fd") {
      ok = integer(&number) && number >= 0;
      s.pause_fd = static_cast<int>(number);
    }
    else if (arg == "--streams") {
      ok = integer(&number) && number >= 1 && number <= 1024;
      s.streams = static_cast<int>(number);
    } else return usage_error("unknown argument " + arg);
    if (!ok) return usage_error(arg + " " + v + ": not a valid value");
  }
  if (s.target.empty()) return usage_error("--target is required");
  if (s.benchmark != "latency" && s.benchmark != "bandwidth")
    return usage_error("--benchmark must be latency or bandwidth");
  if (s.mode != "raw" && s.mode != "protobuf") return usage_error("--mode must be raw or protobuf");
  if (s.rpc != "unary" && s.rpc != "stream") return usage_error("--rpc must be unary or stream");
  if (s.direction != "push" && s.direction != "pull")
    return usage_error("--direction must be push or pull");
  if (s.size < 0) return usage_error("--size must be given, at least 0");
  if (s.dtype == kDtFloat && s.size % 4) return usage_error("--size of a float32 tensor: whole elements");
  if (s.iterations < 1 || s.warmup < 0 || !(s.max_seconds > 0) || !(s.warmup_seconds > 0))
    return usage_error("--iterations >= 1, --warmup >= 0, --max-seconds and --warmup-seconds > 0");
  if (s.chunk_bytes < 64) return usage_error("--chunk-bytes must be at least 64");
  if (!(s.deadline_s > 0)) return usage_error("--deadline-s must be positive");
  try {
    Tls tls = Tls::from_env();
    s.credentials = tls.channel_credentials();
    s.tls_mode = tls.mode();
  } catch (const TlsError& error) {
    std::cerr << "TLS settings: " << error.what() << "\n";
    return 2;
  }
  try {
    return run(s);
  } catch (const std::exception& error) {
    std::cerr << error.what() << "\n";
    return 3;
  }
}
