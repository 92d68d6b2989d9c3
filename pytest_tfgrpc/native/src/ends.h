// The ends of a process's TCP connections, as it tells them to its parent ("local>peer",
// "address:port" or "[v6]:port" each), so that the parent reads their TCP state by their
// exact addresses (sock_diag lookups) instead of a walk of the kernel's connection table:
// the native client at its pauses (client.cc), a native PS worker when it is ready
// (worker.cc), as pytest_tfgrpc/wire/telemetry.py's own_connections does for Python.

#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace tfgrpc {

// "address:port" ("[v6]:port") of an IPv4 or IPv6 socket address; empty for another family.
inline std::string endpoint(const sockaddr_storage& where) {
  char text[INET6_ADDRSTRLEN] = {0};
  if (where.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&where);
    if (!inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text)) return "";
    return std::string(text) + ":" + std::to_string(ntohs(v4->sin_port));
  }
  if (where.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&where);
    if (!inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text)) return "";
    return "[" + std::string(text) + "]:" + std::to_string(ntohs(v6->sin6_port));
  }
  return "";
}

// "local>peer" of descriptor `fd` now; empty where it is not a connected TCP socket (or is
// gone).
inline std::string ends_of(int fd) {
  int type = 0;
  socklen_t size = sizeof type;
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &size) != 0 || type != SOCK_STREAM) return "";
  sockaddr_storage local{}, peer{};
  socklen_t local_size = sizeof local, peer_size = sizeof peer;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_size) ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_size)) {
    return "";  // not connected
  }
  std::string near = endpoint(local), far = endpoint(peer);
  return near.empty() || far.empty() ? "" : near + ">" + far;
}

// A connected TCP socket of this process: its descriptor and "local>peer".
struct Connection {
  int fd;
  std::string ends;
};

// Every connected TCP socket of this process (its gRPC connections), read from its own
// descriptors.
inline std::vector<Connection> connections() {
  std::vector<Connection> out;
  DIR* fds = opendir("/proc/self/fd");
  if (fds == nullptr) return out;
  while (const dirent* entry = readdir(fds)) {
    char* end = nullptr;
    long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(fds)) continue;
    std::string ends = ends_of(static_cast<int>(fd));
    if (!ends.empty()) out.push_back({static_cast<int>(fd), std::move(ends)});
  }
  closedir(fds);
  return out;
}

// "local>peer" for each connected TCP socket of this process.
inline std::vector<std::string> connection_ends() {
  std::vector<std::string> out;
  for (Connection& connection : connections()) out.push_back(std::move(connection.ends));
  return out;
}

}  // namespace tfgrpc
