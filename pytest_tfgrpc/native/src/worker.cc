// tfgrpc-native-worker: the PS-benchmark worker of pytest_tfgrpc/ps/worker.py in C++.
//
// It speaks the same worker protocol (protos/tfgrpc/worker.proto, framed as
// pytest_tfgrpc/ps/jobs.py frames it: each message's size as a varint, then its bytes; samples
// as packed int64 nanoseconds) on stdin/stdout, and makes the same tfgrpc.ParameterServer
// calls against the plugin's PS tasks (Python or native), each carrying
// the cluster's job token ($TFGRPC_JOB_TOKEN):
//
// 1. it writes Hello once it is up;
// 2. the parent writes a job (ThroughputJob or SyncSGDJob); the worker connects to every PS,
//    prepares and writes Ready;
// 3. the parent writes Go to all workers at once; the worker runs the job and writes its
//    reply (ThroughputReply or SyncSGDReply), then waits for the next job.
//
// Any failure is written as WorkerFailed. It exits when its stdin closes, so no worker
// outlives its parent. TLS as its parent's run ($TFGRPC_TLS_*, tls.h). The messages are
// encoded by hand with wire.h's protobuf primitives, as the rest of the native engine's are.
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/sync_stream.h>
#include <sys/resource.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "call.h"
#include "ends.h"
#include "tls.h"
#include "wire.h"

namespace tfgrpc {
namespace {

using grpc::ByteBuffer;
using grpc::ClientContext;
using grpc::internal::RpcMethod;

// parameter_server.py: services, phase metadata, phases.
constexpr const char* kService = "/tfgrpc.ParameterServer/";
constexpr const char* kRawService = "/tfgrpc.RawParameterServer/";
constexpr const char* kPhaseKey = "x-tfgrpc-phase";
constexpr const char* kNextPhaseKey = "x-tfgrpc-next-phase";
constexpr const char* kWarmup = "warmup";
constexpr const char* kMeasure = "measure";
constexpr const char* kStop = "stop";
// security.TOKEN_ENV, TOKEN_KEY: the run's job token, which every PS call carries.
constexpr const char* kTokenEnv = "TFGRPC_JOB_TOKEN";
constexpr const char* kTokenKey = "x-tfgrpc-job-token";
// ps/worker.py: how long a worker waits for the parent's "go" after saying it is ready.
constexpr double kGoTimeoutS = 120.0;

// --- the worker protocol (protos/tfgrpc/worker.proto) --------------------------------------
// ps/jobs.py MAX_FRAME_BYTES: a size beyond it is a broken stream, not a message.
constexpr uint64_t kMaxFrameBytes = 1ULL << 30;

// The job token of the cluster this worker belongs to (read once at start).
std::string job_token;

// A call's context: its deadline and the run's token.
void prepare(ClientContext* context, double timeout_s) {
  set_deadline(context, timeout_s);
  if (!job_token.empty()) context->AddMetadata(kTokenKey, job_token);
}

struct Shard {
  int64_t offset;  // in the tensor, bytes
  int64_t nbytes;
};

// ThroughputJob and SyncSGDJob (one struct: `kind` says which), or Go.
struct Job {
  enum Kind { kNone, kThroughput, kSyncSgd, kGo } kind = kNone;
  std::vector<std::string> targets;
  int64_t worker = 0;
  std::string mode;
  std::vector<int64_t> payload_bytes;
  int64_t iterations = 0;
  int64_t warmup = 0;
  double warmup_seconds = 0;
  double seconds = 0;
  std::vector<std::vector<Shard>> shards;
  int64_t chunk_bytes = 0;
  int64_t max_steps = 0;
  double barrier_timeout = 0;
  bool check = false;
  bool go = false;
};

std::string length_delimited(const std::string& body) {
  std::string out;
  put_varint(&out, body.size());
  out += body;
  return out;
}

// One field's bytes (wire type LEN) at the reader, checked against its bounds.
std::string bytes_at(Reader* r) {
  uint64_t size = r->varint();
  if (!r->ok || size > r->n - r->pos) {
    r->ok = false;
    return "";
  }
  std::string out(reinterpret_cast<const char*>(r->p + r->pos), size);
  r->pos += size;
  return out;
}

double double_at(Reader* r) {
  double value = 0;
  if (r->pos + 8 > r->n) {
    r->ok = false;
    return 0;
  }
  std::memcpy(&value, r->p + r->pos, 8);  // little-endian hosts (x86, arm64)
  r->pos += 8;
  return value;
}

// A repeated integer field, packed (LEN) or not (VARINT), appended to `out`.
void integers_at(Reader* r, int wire, std::vector<int64_t>* out) {
  if (wire == kVarint) {
    out->push_back(static_cast<int64_t>(r->varint()));
    return;
  }
  std::string packed = bytes_at(r);
  Reader inner{reinterpret_cast<const uint8_t*>(packed.data()), packed.size()};
  while (!inner.done()) out->push_back(static_cast<int64_t>(inner.varint()));
  if (!inner.ok) r->ok = false;
}

// Walk the fields of `data`: fn(reader, number, wire) reads the ones it knows, returning
// false for others, which are skipped. False when the bytes are malformed.
template <class Fn>
bool fields(const std::string& data, Fn fn) {
  Reader r{reinterpret_cast<const uint8_t*>(data.data()), data.size()};
  while (!r.done()) {
    uint64_t tag = r.varint();
    int number = static_cast<int>(tag >> 3), wire = static_cast<int>(tag & 7);
    if (!r.ok) break;
    if (!fn(&r, number, wire)) r.skip(wire);
  }
  return r.ok;
}

// The driver's message (a ToWorker envelope); CallError("bad job: ...") when malformed.
Job parse_job(const std::string& body) {
  Job job;
  std::string inner;
  bool ok = fields(body, [&](Reader* r, int number, int wire) {
    if (wire != kLen || number < 1 || number > 3) return false;
    job.kind = static_cast<Job::Kind>(number);
    inner = bytes_at(r);
    return true;
  });
  if (!ok) throw CallError("bad job: not a driver message");
  if (job.kind == Job::kNone) throw CallError("bad job: an empty driver message (no job, no go)");
  ok = fields(inner, [&](Reader* r, int number, int wire) {
    if (job.kind == Job::kGo) {
      if (number == 1 && wire == kVarint) return (job.go = r->varint() != 0), true;
      return false;
    }
    if (number == 1 && wire == kLen) return job.targets.push_back(bytes_at(r)), true;
    if (number == 2 && wire == kVarint) return (job.worker = int64_t(r->varint())), true;
    if (job.kind == Job::kThroughput) {
      switch (number) {
        case 3: return wire == kLen && ((job.mode = bytes_at(r)), true);
        case 4: return (wire == kLen || wire == kVarint) &&
                       (integers_at(r, wire, &job.payload_bytes), true);
        case 5: return wire == kVarint && ((job.iterations = int64_t(r->varint())), true);
        case 6: return wire == kVarint && ((job.warmup = int64_t(r->varint())), true);
        case 7: return wire == kI64 && ((job.warmup_seconds = double_at(r)), true);
        case 8: return wire == kI64 && ((job.seconds = double_at(r)), true);
      }
      return false;
    }
    switch (number) {
      case 3: {
        if (wire != kLen) return false;
        job.shards.emplace_back();
        std::string owned = bytes_at(r);
        bool fine = fields(owned, [&](Reader* o, int n, int w) {
          if (n != 1 || w != kLen) return false;
          Shard shard{0, 0};
          bool good = fields(bytes_at(o), [&](Reader* s, int f, int sw) {
            if (sw != kVarint || (f != 1 && f != 2)) return false;
            (f == 1 ? shard.offset : shard.nbytes) = int64_t(s->varint());
            return true;
          });
          if (!good) o->ok = false;
          job.shards.back().push_back(shard);
          return true;
        });
        if (!fine) r->ok = false;
        return true;
      }
      case 4: return wire == kVarint && ((job.chunk_bytes = int64_t(r->varint())), true);
      case 5: return wire == kVarint && ((job.warmup = int64_t(r->varint())), true);
      case 6: return wire == kVarint && ((job.max_steps = int64_t(r->varint())), true);
      case 7: return wire == kI64 && ((job.barrier_timeout = double_at(r)), true);
      case 8: return wire == kVarint && ((job.check = r->varint() != 0), true);
    }
    return false;
  });
  if (!ok) throw CallError("bad job: a malformed job");
  return job;
}

// FromWorker's fields: the message kinds a worker writes.
enum Reply { kHello = 1, kReady = 2, kFailed = 3, kThroughputReply = 4, kSyncSgdReply = 5 };

void emit(Reply kind, const std::string& message) {
  std::string envelope;
  put_len_field(&envelope, kind, message);
  std::string framed = length_delimited(envelope);
  std::fwrite(framed.data(), 1, framed.size(), stdout);
  std::fflush(stdout);
}

void emit_error(const std::string& error) {
  std::string message;
  put_len_field(&message, 1, error.empty() ? "error" : error);
  emit(kFailed, message);
}

// Nanosecond samples as a packed repeated int64 field `number`.
void put_samples(std::string* out, int number, const std::vector<int64_t>& samples) {
  if (samples.empty()) return;
  std::string packed;
  for (int64_t ns : samples) put_varint(&packed, static_cast<uint64_t>(ns));
  put_len_field(out, number, packed);
}

// --- the parent's messages -----------------------------------------------------------------
std::mutex messages_mutex;
std::condition_variable messages_ready;
std::deque<std::string> messages;

// Read stdin's messages; at end of file the parent is gone or done, and on a stream that is
// not framed nothing more can be read: exit at once.
void lifeline() {
  std::string buffer;
  char chunk[1 << 16];
  ssize_t got;
  while ((got = read(0, chunk, sizeof chunk)) > 0) {
    buffer.append(chunk, static_cast<size_t>(got));
    while (true) {
      Reader r{reinterpret_cast<const uint8_t*>(buffer.data()), buffer.size()};
      uint64_t size = r.varint();
      if (!r.ok) {
        if (buffer.size() < 10) break;  // the size itself is not all here yet
        emit_error("bad job stream: a message size longer than a varint: the stream is not framed");
        std::fflush(stdout);
        _exit(0);
      }
      if (size > kMaxFrameBytes) {
        emit_error("bad job stream: a message of " + std::to_string(size) + " bytes");
        std::fflush(stdout);
        _exit(0);
      }
      if (buffer.size() - r.pos < size) break;
      std::lock_guard<std::mutex> lock(messages_mutex);
      messages.push_back(buffer.substr(r.pos, size));
      buffer.erase(0, r.pos + size);
      messages_ready.notify_one();
    }
  }
  std::fflush(stdout);
  _exit(0);
}

// The next message's bytes, or nothing after `timeout_s` (< 0: wait for ever).
bool next_message(std::string* out, double timeout_s) {
  std::unique_lock<std::mutex> lock(messages_mutex);
  auto has = [] { return !messages.empty(); };
  if (timeout_s < 0) {
    messages_ready.wait(lock, has);
  } else if (!messages_ready.wait_for(lock, std::chrono::duration<double>(timeout_s), has)) {
    return false;
  }
  *out = std::move(messages.front());
  messages.pop_front();
  return true;
}

// The start barrier: say ready, with the ends of this process's connections (Ready's
// connections: the parent reads the PS tasks' telemetry by them), then wait until the
// parent tells every worker to go.
void wait_for_go() {
  std::string ready;
  for (const std::string& ends : connection_ends()) put_len_field(&ready, 1, ends);
  emit(kReady, ready);
  std::string body;
  if (!next_message(&body, kGoTimeoutS)) {
    throw CallError("no word from the parent within " + std::to_string(int(kGoTimeoutS)) + " s");
  }
  Job go = parse_job(body);
  if (go.kind != Job::kGo) throw CallError("a job where Go was expected");
  if (!go.go) throw CallError("the parent called the run off");
}

// --- samples and CPU -----------------------------------------------------------------------
struct Cpu {
  int64_t user = 0;
  int64_t system = 0;
};

Cpu cpu_now() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return {usage.ru_utime.tv_sec * 1000000000LL + usage.ru_utime.tv_usec * 1000LL,
          usage.ru_stime.tv_sec * 1000000000LL + usage.ru_stime.tv_usec * 1000LL};
}

// client.rpc_timeout: 10 s of slack, the job's time bound, the bytes at 1 MB/s.
double rpc_timeout(int64_t nbytes, double bound_s) {
  return 10.0 + bound_s + static_cast<double>(nbytes) / 1e6;
}

// Of the TLS setting its parent handed it ($TFGRPC_TLS_*, tls.h), set once by main().
std::shared_ptr<grpc::ChannelCredentials> credentials;

std::shared_ptr<grpc::Channel> connect(const std::string& target) {
  grpc::ChannelArguments args;
  common_arguments(&args);
  auto channel = grpc::CreateCustomChannel(target, credentials, args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    throw CallError("no connection to " + target + " within 10 s");
  }
  return channel;
}

// Run fn(ps) for every PS at once, one thread each; the first failure is rethrown.
template <class Fn>
void on_every_ps(size_t count, Fn fn) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(count);
  for (size_t ps = 0; ps < count; ++ps) {
    threads.emplace_back([&, ps] {
      try {
        fn(ps);
      } catch (...) {
        errors[ps] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

// --- PS throughput -------------------------------------------------------------------------
std::string throughput(const Job& job,
                       const std::vector<std::shared_ptr<grpc::Channel>>& channels) {
  const auto& targets = job.targets;
  const auto& sizes = job.payload_bytes;
  bool protobuf = job.mode == "protobuf";
  if (!protobuf && job.mode != "raw") throw CallError("bad job: mode: expected raw or protobuf");
  if (sizes.size() != targets.size()) throw CallError("bad job: payload_bytes: one size per target");
  int64_t iterations = job.iterations, warmup = job.warmup;
  double warmup_seconds = job.warmup_seconds, seconds = job.seconds;
  std::string path = std::string(protobuf ? kService : kRawService) + "Throughput";
  std::vector<RpcMethod> methods;
  std::vector<grpc::Slice> contents;
  for (size_t ps = 0; ps < channels.size(); ++ps) {
    methods.emplace_back(interned(path), RpcMethod::NORMAL_RPC, channels[ps]);
    contents.push_back(make_content(sizes[ps]));
  }
  double bound = warmup_seconds + seconds;

  // One closed loop on PS `ps`: at most `count` calls, none started after `limit_s`.
  auto loop = [&](size_t ps, int64_t count, double limit_s, const char* phase,
                  std::vector<int64_t>* samples) {
    int64_t size = sizes[ps];
    int dtype = size % 4 ? kDtUint8 : kDtFloat;
    std::vector<int64_t> shape = {size / (dtype == kDtFloat ? 4 : 1)};
    double timeout = rpc_timeout(size, bound);
    int64_t end = now_ns() + static_cast<int64_t>(limit_s * 1e9);
    for (int64_t i = 0; i < count; ++i) {
      int64_t t0 = now_ns();
      // protobuf: the header encoded in the timed region, as the Python worker encodes it.
      ByteBuffer request;
      if (protobuf) {
        grpc::Slice slices[2] = {grpc::Slice(encode_header(dtype, shape, size)), contents[ps]};
        request = ByteBuffer(slices, 2);
      } else {
        request = ByteBuffer(&contents[ps], 1);
      }
      ClientContext context;
      prepare(&context, timeout);
      context.AddMetadata(kPhaseKey, phase);
      ByteBuffer reply;
      check(grpc::internal::BlockingUnaryCall(channels[ps].get(), methods[ps], &context, request,
                                              &reply),
            "Throughput of " + std::to_string(size) + " B to " + targets[ps]);
      int64_t t1 = now_ns();
      samples->push_back(t1 - t0);
      if (t1 >= end) return;
    }
  };

  // One untimed call per PS proves the path before anyone is told to start.
  std::vector<std::vector<int64_t>> ignored(channels.size());
  on_every_ps(channels.size(), [&](size_t ps) { loop(ps, 1, 60.0, kWarmup, &ignored[ps]); });
  wait_for_go();
  on_every_ps(channels.size(),
              [&](size_t ps) { loop(ps, warmup, warmup_seconds, kWarmup, &ignored[ps]); });
  std::vector<std::vector<int64_t>> samples(channels.size());
  for (auto& each : samples) each.reserve(static_cast<size_t>(std::min<int64_t>(iterations, 1 << 20)));
  Cpu cpu0 = cpu_now();
  int64_t start = now_ns();
  on_every_ps(channels.size(),
              [&](size_t ps) { loop(ps, iterations, seconds, kMeasure, &samples[ps]); });
  int64_t elapsed = std::max<int64_t>(1, now_ns() - start);
  Cpu cpu1 = cpu_now();
  std::string reply;
  for (const auto& each : samples) {
    std::string one;
    put_samples(&one, 1, each);
    put_len_field(&reply, 1, one);
  }
  put_varint_field(&reply, 2, static_cast<uint64_t>(elapsed));
  put_varint_field(&reply, 3, static_cast<uint64_t>(cpu1.user - cpu0.user));
  put_varint_field(&reply, 4, static_cast<uint64_t>(cpu1.system - cpu0.system));
  return reply;
}

// --- sync SGD ------------------------------------------------------------------------------
// A WeightChunk (service.proto): shard 1, offset 2, data 3, step 4, worker 5, measured 6.
std::string weight_chunk_head(int64_t shard, int64_t offset, size_t data_bytes) {
  std::string out;
  if (shard) put_varint_field(&out, 1, static_cast<uint64_t>(shard));
  if (offset) put_varint_field(&out, 2, static_cast<uint64_t>(offset));
  put_tag(&out, 3, kLen);
  put_varint(&out, data_bytes);
  return out;
}

std::string step_fields(int64_t step, int64_t worker, bool measured, int first) {
  std::string out;
  if (step) put_varint_field(&out, first, static_cast<uint64_t>(step));
  if (worker) put_varint_field(&out, first + 1, static_cast<uint64_t>(worker));
  if (measured) put_varint_field(&out, first + 2, 1);
  return out;
}

// The bytes of the data field (3) of an encoded WeightChunk; -1 if it is not one.
int64_t chunk_data_bytes(const ByteBuffer& buffer) {
  std::string head = peek(buffer, kPeekBytes);
  Reader r{reinterpret_cast<const uint8_t*>(head.data()), head.size()};
  while (!r.done()) {
    uint64_t key = r.varint();
    int number = static_cast<int>(key >> 3);
    int wire = static_cast<int>(key & 7);
    if (number == 3 && wire == kLen) {
      uint64_t length = r.varint();
      return r.ok ? static_cast<int64_t>(length) : -1;
    }
    r.skip(wire);
  }
  return r.ok ? 0 : -1;  // no data field: an empty slice
}

// The float32 gradient of one shard at one step, little-endian bytes.
std::string gradient(bool check_mode, int64_t worker, int64_t step, const Shard& shard,
                     uint64_t seed) {
  size_t count = static_cast<size_t>(shard.nbytes / 4);
  std::vector<float> values(count);
  if (check_mode) {
    // parameter_server.check_gradient: element j of the tensor is ((w+1)*(s+1) + j) % 16.
    int64_t first = shard.offset / 4;
    for (size_t i = 0; i < count; ++i) {
      values[i] = static_cast<float>(((worker + 1) * (step + 1) + first + int64_t(i)) % 16);
    }
  } else {
    // Small pseudo-random values, as the Python worker's 1e-3 * N(0, 1): the PS only sums them.
    uint64_t state = seed | 1;
    for (size_t i = 0; i < count; ++i) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      values[i] = (static_cast<float>(state >> 40) / float(1 << 24) - 0.5f) * 2e-3f;
    }
  }
  std::string out(count * 4, '\0');
  if (count) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// The slices of one push of PS `ps`'s shards, `chunk_bytes` of data each, encoded once.
std::vector<grpc::Slice> chunks(const std::vector<std::string>& gradients, int64_t chunk_bytes) {
  std::vector<grpc::Slice> out;
  for (size_t shard = 0; shard < gradients.size(); ++shard) {
    const std::string& data = gradients[shard];
    for (size_t offset = 0; offset < data.size(); offset += static_cast<size_t>(chunk_bytes)) {
      size_t length = std::min(data.size() - offset, static_cast<size_t>(chunk_bytes));
      out.emplace_back(weight_chunk_head(int64_t(shard), int64_t(offset), length) +
                       data.substr(offset, length));
    }
  }
  return out;
}

std::string sync_sgd(const Job& job,
                     const std::vector<std::shared_ptr<grpc::Channel>>& channels) {
  const auto& targets = job.targets;
  int64_t worker = job.worker;
  bool check_mode = job.check;
  int64_t chunk_bytes = job.chunk_bytes, warmup = job.warmup, max_steps = job.max_steps;
  double barrier_timeout = job.barrier_timeout;
  const auto& shards = job.shards;
  std::vector<int64_t> owned;
  for (const auto& mine : shards) {
    owned.push_back(0);
    for (const Shard& shard : mine) owned.back() += shard.nbytes;
  }
  if (shards.size() != targets.size()) throw CallError("bad job: shards: one list per target");
  if (chunk_bytes < 1) throw CallError("bad job: chunk_bytes: at least 1");
  double timeout = barrier_timeout + rpc_timeout(*std::max_element(owned.begin(), owned.end()), 0);
  std::vector<RpcMethod> pushes, pulls;
  for (const auto& channel : channels) {
    pushes.emplace_back(interned(std::string(kService) + "PushGradients"),
                        RpcMethod::CLIENT_STREAMING, channel);
    pulls.emplace_back(interned(std::string(kService) + "PullWeights"),
                       RpcMethod::SERVER_STREAMING, channel);
  }
  auto bodies_at = [&](int64_t step) {
    std::vector<std::vector<grpc::Slice>> out;
    for (size_t ps = 0; ps < channels.size(); ++ps) {
      std::vector<std::string> gradients;
      for (const Shard& shard : shards[ps]) {
        gradients.push_back(gradient(check_mode, worker, step, shard,
                                     uint64_t(worker) << 32 ^ uint64_t(ps) << 16 ^ gradients.size()));
      }
      out.push_back(chunks(gradients, chunk_bytes));
    }
    return out;
  };
  std::vector<std::vector<grpc::Slice>> fixed;
  if (!check_mode) fixed = bodies_at(0);

  // One step on PS `ps`: push every gradient slice, then pull the updated weights; returns
  // the phase the PS says comes next (the chief PS's trailing metadata).
  auto step_on = [&](size_t ps, int64_t step, bool measured,
                     const std::vector<grpc::Slice>& body) -> std::string {
    const std::string& target = targets[ps];
    std::string what = " of step " + std::to_string(step) + " to " + target;
    {
      ClientContext context;
      prepare(&context, timeout);
      ByteBuffer ack;
      std::unique_ptr<grpc::ClientWriter<ByteBuffer>> writer(
          grpc::internal::ClientWriterFactory<ByteBuffer>::Create(channels[ps].get(), pushes[ps],
                                                                  &context, &ack));
      bool ok = writer->Write(to_buffer(step_fields(step, worker, measured, 4)));
      for (size_t i = 0; ok && i < body.size(); ++i) ok = writer->Write(ByteBuffer(&body[i], 1));
      writer->WritesDone();
      check(writer->Finish(), "push" + what);
    }
    ClientContext context;
    prepare(&context, timeout);
    std::string request = step_fields(step, worker, measured, 1);
    put_varint_field(&request, 4, static_cast<uint64_t>(chunk_bytes));
    std::unique_ptr<grpc::ClientReader<ByteBuffer>> reader(
        grpc::internal::ClientReaderFactory<ByteBuffer>::Create(
            channels[ps].get(), pulls[ps], &context, to_buffer(request)));
    int64_t got = 0;
    ByteBuffer reply;
    bool malformed = false;
    while (reader->Read(&reply)) {
      int64_t data = chunk_data_bytes(reply);
      if (data < 0) malformed = true;
      got += std::max<int64_t>(data, 0);
    }
    check(reader->Finish(), "pull" + what);
    if (malformed) throw CallError("pull" + what + ": a reply is not a WeightChunk");
    if (got != owned[ps]) {
      throw CallError("pulled " + std::to_string(got) + " B of weights from " + target +
                      ", it owns " + std::to_string(owned[ps]) + " B");
    }
    const auto& trailing = context.GetServerTrailingMetadata();
    auto found = trailing.find(kNextPhaseKey);
    return found == trailing.end() ? "" : std::string(found->second.data(), found->second.size());
  };

  wait_for_go();
  std::string phase = warmup > 0 ? kWarmup : kMeasure;
  std::vector<int64_t> samples;
  Cpu cpu0{};
  bool counting = false;
  int64_t step = 0;
  while (phase != kStop && step < max_steps) {
    bool measured = phase == kMeasure;
    std::vector<std::vector<grpc::Slice>> fresh;
    if (check_mode) fresh = bodies_at(step);
    const auto& bodies = check_mode ? fresh : fixed;
    if (measured && !counting) {
      cpu0 = cpu_now();
      counting = true;
    }
    std::vector<std::string> phases(channels.size());
    int64_t t0 = now_ns();
    on_every_ps(channels.size(),
                [&](size_t ps) { phases[ps] = step_on(ps, step, measured, bodies[ps]); });
    int64_t t1 = now_ns();
    if (measured) samples.push_back(t1 - t0);
    if (phases[0] != kWarmup && phases[0] != kMeasure && phases[0] != kStop) {
      throw CallError("the chief PS sent no next phase after step " + std::to_string(step));
    }
    phase = phases[0];
    ++step;
  }
  Cpu cpu1 = cpu_now();
  if (!counting) cpu0 = cpu1;
  std::string reply;
  put_samples(&reply, 1, samples);
  put_varint_field(&reply, 2, static_cast<uint64_t>(step));
  put_varint_field(&reply, 3, static_cast<uint64_t>(cpu1.user - cpu0.user));
  put_varint_field(&reply, 4, static_cast<uint64_t>(cpu1.system - cpu0.system));
  return reply;
}

// Per PS target, the channel of the jobs so far: kept open from one job to the next (a
// worker's connections live as long as it does, as TensorFlow's), so that the driver can read
// their TCP state once a job's replies are in. Dropped after a failed job.
std::map<std::string, std::shared_ptr<grpc::Channel>> kept_channels;

// Run `job`; writes its reply.
void run(const Job& job) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  if (job.targets.empty()) {
    throw CallError("bad job: targets: expected a non-empty list of host:port");
  }
  for (const auto& target : job.targets) {
    std::shared_ptr<grpc::Channel>& channel = kept_channels[target];
    if (!channel) channel = connect(target);
    channels.push_back(channel);
  }
  if (job.kind == Job::kThroughput) {
    emit(kThroughputReply, throughput(job, channels));
  } else {
    emit(kSyncSgdReply, sync_sgd(job, channels));
  }
}

}  // namespace
}  // namespace tfgrpc

int main() {
  using namespace tfgrpc;
  try {
    credentials = Tls::from_env().channel_credentials();
  } catch (const TlsError& error) {
    emit_error(std::string("TLS settings: ") + error.what());
    return 2;
  }
  if (const char* token = std::getenv(kTokenEnv)) job_token = token;
  unsetenv(kTokenEnv);
  std::thread(lifeline).detach();
  std::string hello;
  put_varint_field(&hello, 1, static_cast<uint64_t>(getpid()));
  emit(kHello, hello);
  while (true) {
    std::string body;
    next_message(&body, -1);
    try {
      Job job = parse_job(body);
      if (job.kind == Job::kGo) continue;  // a Go meant for a job that failed before it was ready
      run(job);
    } catch (const std::exception& error) {
      kept_channels.clear();
      emit_error(error.what());
    }
  }
}
