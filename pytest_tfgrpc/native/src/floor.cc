// tfgrpc-native-floor: the raw-TCP transport floor of pytest_tfgrpc/roles/floor_server.py and
// pytest_tfgrpc/bench/floor.py in C++, so the native engine's "x the floor" compares two native
// figures. The same protocol: every operation is a header (op: 1 byte, payload length: 8 bytes
// big-endian) sent in one buffer with its payload; ECHO (1) sends the payload back, SINK_ACK (2)
// answers one byte 0x06 once the payload was read, SINK (3) answers nothing, ACK (4, no
// payload) answers 0x06 once everything before it was read.
//
//   tfgrpc-native-floor serve --bind ADDRESS [--port N] [--max-payload-bytes N]
//     listens on exactly ADDRESS (never a wildcard), prints {"port": N, "pid": P} once
//     listening, serves each connection on its own thread, and exits when stdin closes.
//   tfgrpc-native-floor measure --host ADDRESS --port N --op echo|push_ack --size BYTES
//       --iterations N --warmup N --max-seconds S --warmup-seconds S --io-timeout-s S
//     times operations on one connection as bench/timing.measure does (warm-up bounded by
//     count and time, then at most N operations, none started after the time limit) and
//     prints one line: the samples in ns, space-separated. Failures: one line on stderr, exit 1.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr uint8_t kEcho = 1, kSinkAck = 2, kSink = 3, kAck = 4;
constexpr uint8_t kAckByte = 0x06;
constexpr size_t kHeader = 9;
constexpr size_t kSinkChunk = 4 << 20;

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool read_exact(int fd, uint8_t* p, size_t n) {
  while (n) {
    ssize_t got = recv(fd, p, n, 0);
    if (got <= 0) {
      if (got < 0 && errno == EINTR) continue;
      return false;
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

bool write_all(int fd, const uint8_t* p, size_t n) {
  while (n) {
    ssize_t sent = send(fd, p, n, MSG_NOSIGNAL);
    if (sent <= 0) {
      if (sent < 0 && errno == EINTR) continue;
      return false;
    }
    p += sent;
    n -= static_cast<size_t>(sent);
  }
  return true;
}

void put_header(uint8_t* out, uint8_t op, uint64_t length) {
  out[0] = op;
  for (int i = 0; i < 8; ++i) out[1 + i] = static_cast<uint8_t>(length >> (56 - 8 * i));
}

// --- serve -------------------------------------------------------------------------------
// One connection: operations until the peer closes, breaks the protocol, or asks for more
// than max_payload (dropped, as the Python floor drops a corrupt header).
void serve_connection(int fd, uint64_t max_payload) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<uint8_t> buffer(kSinkChunk);
  uint8_t header[kHeader];
  while (read_exact(fd, header, kHeader)) {
    uint64_t length = 0;
    for (int i = 0; i < 8; ++i) length = length << 8 | header[1 + i];
    uint8_t op = header[0];
    if (length > max_payload) break;
    if (op == kEcho) {
      if (length > buffer.size()) buffer.resize(length);
      if (!read_exact(fd, buffer.data(), length) || !write_all(fd, buffer.data(), length)) break;
    } else if (op == kSinkAck || op == kSink) {
      uint64_t remaining = length;
      bool ok = true;
      while (ok && remaining) {
        size_t take = static_cast<size_t>(std::min<uint64_t>(remaining, kSinkChunk));
        ok = read_exact(fd, buffer.data(), take);
        remaining -= take;
      }
      if (!ok || (op == kSinkAck && !write_all(fd, &kAckByte, 1))) break;
    } else if (op == kAck) {
      if (!write_all(fd, &kAckByte, 1)) break;
    } else {
      break;  // out of sync: drop the connection
    }
    if (buffer.size() > kSinkChunk) std::vector<uint8_t>(kSinkChunk).swap(buffer);
  }
  close(fd);
}

int usage(const std::string& message) {
  std::cerr << "tfgrpc-native-floor: error: " << message << "\n"
            << "usage: tfgrpc-native-floor serve --bind ADDRESS [--port N] "
               "[--max-payload-bytes N]\n"
               "       tfgrpc-native-floor measure --host ADDRESS --port N --op echo|push_ack "
               "--size BYTES --iterations N --warmup N --max-seconds S --warmup-seconds S "
               "--io-timeout-s S\n";
  return 2;
}

// A numeric address (an IPv6 one may carry %zone); wildcards are refused.
addrinfo* numeric(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) {
    throw Failure("not a numeric IPv4/IPv6 address: '" + host + "'");
  }
  return found;
}

bool unspecified(const addrinfo* info) {
  if (info->ai_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(info->ai_addr)->sin_addr.s_addr == INADDR_ANY;
  }
  const auto* v6 = reinterpret_cast<const sockaddr_in6*>(info->ai_addr);
  return IN6_IS_ADDR_UNSPECIFIED(&v6->sin6_addr);
}

int serve(const std::string& bind, int port, uint64_t max_payload) {
  addrinfo* info = numeric(bind, port, true);
  if (unspecified(info)) {
    freeaddrinfo(info);
    throw Failure("refusing to bind to '" + bind + "': it means all interfaces, name one address");
  }
  int listener = socket(info->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (listener < 0 || ::bind(listener, info->ai_addr, info->ai_addrlen) != 0 ||
      listen(listener, 16) != 0) {
    std::string why = std::strerror(errno);
    freeaddrinfo(info);
    throw Failure("cannot bind to '" + bind + "' port " + std::to_string(port) + ": " + why);
  }
  freeaddrinfo(info);
  sockaddr_storage bound{};
  socklen_t size = sizeof bound;
  getsockname(listener, reinterpret_cast<sockaddr*>(&bound), &size);
  int actual = ntohs(bound.ss_family == AF_INET
                         ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                         : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  std::thread([listener, max_payload] {
    for (;;) {
      int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;
      }
      std::thread(serve_connection, fd, max_payload).detach();
    }
  }).detach();
  std::printf("{\"port\": %d, \"pid\": %d, \"engine\": \"native\"}\n", actual, getpid());
  std::fflush(stdout);
  char sink[4096];
  while (read(0, sink, sizeof sink) > 0) {
  }
  return 0;  // stdin closed: the parent is gone or done
}

// --- measure -----------------------------------------------------------------------------
struct Run {
  int64_t iterations = 0;
  int64_t warmup = 0;
  double max_seconds = 0;
  double warmup_seconds = 0;
};

int connect_to(const std::string& host, int port, double io_timeout_s) {
  addrinfo* info = numeric(host, port, false);
  int fd = socket(info->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{static_cast<time_t>(io_timeout_s),
             static_cast<suseconds_t>((io_timeout_s - static_cast<int64_t>(io_timeout_s)) * 1e6)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (fd < 0 || connect(fd, info->ai_addr, info->ai_addrlen) != 0) {
    std::string why = std::strerror(errno);
    freeaddrinfo(info);
    throw Failure("cannot connect to " + host + " port " + std::to_string(port) + ": " + why);
  }
  freeaddrinfo(info);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

std::vector<int64_t> measure(int fd, bool echo, uint64_t size, const Run& run) {
  std::vector<uint8_t> send(kHeader + size);
  put_header(send.data(), echo ? kEcho : kSinkAck, size);
  for (uint64_t i = 0; i < size; ++i) {
    send[kHeader + i] = static_cast<uint8_t>((i * 2654435761ULL) >> 13);
  }
  std::vector<uint8_t> back(echo ? size : 1);
  auto op = [&] {
    if (!write_all(fd, send.data(), send.size())) throw Failure("the floor server went away");
    if (!read_exact(fd, back.data(), back.size())) {
      throw Failure(errno == EAGAIN || errno == EWOULDBLOCK
                        ? "no answer from the floor server within the I/O timeout"
                        : "the floor server closed the connection mid-operation");
    }
    if (!echo && back[0] != kAckByte) throw Failure("expected one acknowledgement byte");
  };
  int64_t warm_end = now_ns() + static_cast<int64_t>(run.warmup_seconds * 1e9);
  for (int64_t i = 0; i < run.warmup; ++i) {
    op();
    if (now_ns() >= warm_end) break;
  }
  std::vector<int64_t> samples;
  samples.reserve(static_cast<size_t>(std::min<int64_t>(run.iterations, 1 << 20)));
  int64_t deadline = now_ns() + static_cast<int64_t>(run.max_seconds * 1e9);
  for (int64_t i = 0; i < run.iterations; ++i) {
    int64_t t0 = now_ns();
    op();
    int64_t t1 = now_ns();
    samples.push_back(t1 - t0);
    if (t1 >= deadline) break;
  }
  if (echo && std::memcmp(back.data(), send.data() + kHeader, size) != 0) {
    throw Failure("the floor server echoed different bytes for size " + std::to_string(size));
  }
  return samples;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage("serve or measure?");
  std::string command = argv[1];
  std::string bind, host, op;
  int port = -1;
  int64_t size = -1;
  uint64_t max_payload = 1ULL << 31;  // the largest tensor a gRPC message carries, and then some
  double io_timeout = 60.0;
  Run run;
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (i + 1 >= argc) return usage(arg + " needs a value");
    std::string v = argv[++i];
    char* end = nullptr;
    auto whole = [&](int64_t low) {
      long long value = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end || value < low) throw Failure(arg + " " + v + ": a whole number >= " + std::to_string(low));
      return static_cast<int64_t>(value);
    };
    auto real = [&] {
      double value = std::strtod(v.c_str(), &end);
      if (v.empty() || *end || !(value > 0)) throw Failure(arg + " " + v + ": a positive number");
      return value;
    };
    try {
      if (arg == "--bind") bind = v;
      else if (arg == "--host") host = v;
      else if (arg == "--port") port = static_cast<int>(whole(0));
      else if (arg == "--op") op = v;
      else if (arg == "--size") size = whole(0);
      else if (arg == "--max-payload-bytes") max_payload = static_cast<uint64_t>(whole(0));
      else if (arg == "--iterations") run.iterations = whole(1);
      else if (arg == "--warmup") run.warmup = whole(0);
      else if (arg == "--max-seconds") run.max_seconds = real();
      else if (arg == "--warmup-seconds") run.warmup_seconds = real();
      else if (arg == "--io-timeout-s") io_timeout = real();
      else return usage("unknown argument " + arg);
    } catch (const Failure& error) {
      return usage(error.what());
    }
  }
  if (port > 65535) return usage("--port " + std::to_string(port) + ": at most 65535");
  if (command == "serve") {
    if (bind.empty()) return usage("serve needs --bind ADDRESS");
    try {
      return serve(bind, port < 0 ? 0 : port, max_payload);
    } catch (const Failure& error) {
      std::cerr << "floor: " << error.what() << "\n";  // as the Python floor says it
      return 2;
    }
  }
  try {
    if (command != "measure") return usage("unknown command " + command);
    if (host.empty() || port < 1 || size < 0 || run.iterations < 1 ||
        (op != "echo" && op != "push_ack") || !(run.max_seconds > 0) || !(run.warmup_seconds > 0)) {
      return usage("measure needs --host, --port, --op echo|push_ack, --size, --iterations, "
                   "--max-seconds and --warmup-seconds");
    }
    int fd = connect_to(host, port, io_timeout);
    std::vector<int64_t> samples = measure(fd, op == "echo", static_cast<uint64_t>(size), run);
    close(fd);
    std::string line;
    for (size_t i = 0; i < samples.size(); ++i) {
      if (i) line.push_back(' ');
      line += std::to_string(samples[i]);
    }
    std::printf("%s\n", line.c_str());
    return 0;
  } catch (const Failure& error) {
    std::cerr << "tfgrpc-native-floor: " << error.what() << "\n";
    return 1;
  }
}
