// How long this process's threads have waited on a run queue for a CPU: the second field of
// each /proc/self/task/<tid>/schedstat (ns), summed over the threads alive now. The native
// client reads its own at its pauses (client.cc) and tells its parent, which would otherwise
// list and open its threads' files from outside at every measured size
// (pytest_tfgrpc/wire/telemetry.py reads other processes so).

#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace tfgrpc {

class RunQueueWait {
 public:
  RunQueueWait() = default;
  RunQueueWait(const RunQueueWait&) = delete;
  RunQueueWait& operator=(const RunQueueWait&) = delete;
  ~RunQueueWait() { close_all(); }

  // The threads' run-queue wait now (ns); -1 where it cannot be read. The threads' files are
  // kept open between reads (read again at offset 0: the kernel makes their text anew) and
  // listed again only where the number of threads changed or a file fails to read.
  int64_t read() {
    if (!fds_.empty()) {
      struct stat task {};
      if (stat("/proc/self/task", &task) == 0 && task.st_nlink - 2 == fds_.size()) {
        int64_t total = 0;
        bool whole = true;
        for (int fd : fds_) {
          int64_t waited = waited_ns(fd);
          if (waited < 0) {
            whole = false;
            break;
          }
          total += waited;
        }
        if (whole) return total;
      }
      close_all();
    }
    DIR* tasks = opendir("/proc/self/task");
    if (tasks == nullptr) return -1;
    int64_t total = 0;
    while (const dirent* entry = readdir(tasks)) {
      if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
      std::string path = std::string(entry->d_name) + "/schedstat";
      int fd = openat(dirfd(tasks), path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;  // a thread that ended meanwhile
      int64_t waited = waited_ns(fd);
      if (waited < 0) {
        ::close(fd);
        continue;
      }
      fds_.push_back(fd);
      total += waited;
    }
    closedir(tasks);
    return fds_.empty() ? -1 : total;
  }

 private:
  // The second field of a schedstat file ("<on-CPU ns> <waiting ns> <timeslices>"); -1 if
  // it cannot be read.
  static int64_t waited_ns(int fd) {
    char text[128];
    ssize_t got = pread(fd, text, sizeof text - 1, 0);
    if (got <= 0) return -1;
    text[got] = '\0';
    char* end = nullptr;
    std::strtoll(text, &end, 10);
    if (end == text) return -1;
    char* last = nullptr;
    long long waited = std::strtoll(end, &last, 10);
    return last == end ? -1 : static_cast<int64_t>(waited);
  }

  void close_all() {
    for (int fd : fds_) ::close(fd);
    fds_.clear();
  }

  std::vector<int> fds_;
};

}  // namespace tfgrpc
