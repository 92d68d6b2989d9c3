// The plugin's wire format in C++: method paths, channel arguments, and the hand-encoded
// messages of protos/tfgrpc/*.proto (TensorProto header, TensorChunk, Ack, PullRequest,
// ServerStatus). It mirrors pytest_tfgrpc/wire/grpc_settings.py and wire/codec.py; the interop
// tests (tests/test_native.py) check one against the other in both directions.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/channel_arguments.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace tfgrpc {

// wire/grpc_settings.py: INT32_MAX message limits, no BDP probing, an 8 MiB stream window.
constexpr int kMaxMessageBytes = INT_MAX;
constexpr int kLookaheadBytes = 8 << 20;
constexpr int64_t kDefaultChunkBytes = 1 << 20;
constexpr const char* kMessageBytesKey = "x-tfgrpc-message-bytes";
// channels.FRAMING_BYTES, MAX_TENSOR_BYTES: the message bytes a TensorProto may add around its
// content, and the largest tensor one message carries.
constexpr int64_t kFramingBytes = 64;
constexpr int64_t kMaxTensorBytes = int64_t{kMaxMessageBytes} - kFramingBytes;
// tensor_server._DRAIN_BYTES: the most an over-limit stream push is read before it is refused.
constexpr int64_t kDrainBytes = 64 << 20;
// The smallest slice a streamed reply is cut into (the plugin's clients ask for 64 B at
// least): every slice costs a round through the completion queue and ~15 B of framing, so
// 1-byte slices would cost 15x their bytes on the wire and hold the serving thread.
constexpr int64_t kMinChunkBytes = 64;

inline std::string method_path(const std::string& mode, const std::string& name) {
  return (mode == "raw" ? "/tfgrpc.RawTensorService/" : "/tfgrpc.TensorService/") + name;
}

// Native-engine only (the Python engine keeps gRPC's defaults): the largest HTTP/2 frames a
// peer may send us, and 1 MiB socket reads. Together they cut the receiver's system time per
// 64 MiB tensor by ~20% on loopback here (benchmarks/results/native_*.txt).
constexpr int kMaxFrameBytes = (1 << 24) - 1;
constexpr int kReadChunkBytes = 1 << 20;

template <class Arguments>
void set_arguments(Arguments&& set) {
  set("grpc.http2.bdp_probe", 0);
  set("grpc.http2.lookahead_bytes", kLookaheadBytes);
  set("grpc.http2.max_frame_size", kMaxFrameBytes);
  set("grpc.experimental.tcp_read_chunk_size", kReadChunkBytes);
}

inline void common_arguments(grpc::ChannelArguments* args) {
  args->SetMaxReceiveMessageSize(kMaxMessageBytes);
  args->SetMaxSendMessageSize(kMaxMessageBytes);
  set_arguments([args](const char* key, int value) { args->SetInt(key, value); });
}

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// --- protobuf primitives -----------------------------------------------------------------
constexpr int kVarint = 0;
constexpr int kI64 = 1;
constexpr int kLen = 2;
constexpr int kI32 = 5;

inline void put_varint(std::string* out, uint64_t value) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

inline void put_tag(std::string* out, int number, int wire) {
  put_varint(out, static_cast<uint64_t>(number) << 3 | static_cast<uint64_t>(wire));
}

inline void put_varint_field(std::string* out, int number, uint64_t value) {
  put_tag(out, number, kVarint);
  put_varint(out, value);
}

inline void put_len_field(std::string* out, int number, const std::string& payload) {
  put_tag(out, number, kLen);
  put_varint(out, payload.size());
  out->append(payload);
}

// A cursor over bytes; every read checks bounds and sets `ok` false on malformed input.
struct Reader {
  const uint8_t* p;
  size_t n;
  size_t pos = 0;
  bool ok = true;

  bool done() const { return !ok || pos >= n; }

  uint64_t varint() {
    uint64_t result = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= n) break;
      uint8_t byte = p[pos++];
      result |= static_cast<uint64_t>(byte & 0x7F) << shift;
      if (!(byte & 0x80)) return result;
    }
    ok = false;
    return 0;
  }

  // Skip `count` bytes; a count beyond the end fails without moving (so no length, however
  // near 2^64, can wrap the position).
  void advance(uint64_t count) {
    if (!ok || count > n - pos) {
      ok = false;
      pos = n;
      return;
    }
    pos += static_cast<size_t>(count);
  }

  // The bytes of a length-delimited field's payload (after its tag), in place.
  const uint8_t* bytes(uint64_t* length) {
    *length = varint();
    const uint8_t* start = p + pos;
    advance(*length);
    return ok ? start : nullptr;
  }

  uint64_t fixed(int width) {
    uint64_t value = 0;
    if (ok && static_cast<size_t>(width) <= n - pos) std::memcpy(&value, p + pos, width);
    advance(static_cast<uint64_t>(width));
    return value;
  }

  void skip(int wire) {
    if (wire == kVarint) {
      varint();
    } else if (wire == kI64) {
      advance(8);
    } else if (wire == kI32) {
      advance(4);
    } else if (wire == kLen) {
      advance(varint());
    } else {
      ok = false;
    }
  }
};

// The varint fields numbered 1..N of a small message (others skipped): Ack, PullRequest,
// ServerStatus. Returns false on malformed bytes.
inline bool varint_fields(const std::string& data, std::vector<int64_t>* fields) {
  Reader r{reinterpret_cast<const uint8_t*>(data.data()), data.size()};
  while (!r.done()) {
    uint64_t key = r.varint();
    int number = static_cast<int>(key >> 3);
    int wire = static_cast<int>(key & 7);
    if (wire == kVarint && number >= 1 && static_cast<size_t>(number) <= fields->size()) {
      (*fields)[number - 1] = static_cast<int64_t>(r.varint());
    } else {
      r.skip(wire);
    }
  }
  return r.ok;
}

// --- TensorProto (wire/codec.py) ---------------------------------------------------------
// DataType numbers of the dtypes a generated tensor uses.
constexpr int kDtFloat = 1;
constexpr int kDtUint8 = 4;

// Everything of an encoded TensorProto that precedes its content (codec.encode_header).
inline std::string encode_header(int dtype, const std::vector<int64_t>& shape,
                                 uint64_t content_bytes) {
  std::string dims;
  for (int64_t size : shape) {
    std::string dim;
    if (size) put_varint_field(&dim, 1, static_cast<uint64_t>(size));
    put_len_field(&dims, 2, dim);
  }
  std::string out;
  put_varint_field(&out, 1, static_cast<uint64_t>(dtype));
  put_len_field(&out, 2, dims);
  put_tag(&out, 4, kLen);
  put_varint(&out, content_bytes);
  return out;
}

// (offset, length) of tensor_content in the first bytes of a TensorProto (codec.content_span).
struct ContentSpan {
  bool ok = false;
  int dtype = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

inline ContentSpan content_span(const uint8_t* p, size_t n) {
  ContentSpan span;
  Reader r{p, n};
  while (!r.done()) {
    uint64_t key = r.varint();
    int number = static_cast<int>(key >> 3);
    int wire = static_cast<int>(key & 7);
    if (number == 1 && wire == kVarint) {
      span.dtype = static_cast<int>(r.varint());
    } else if (number == 4 && wire == kLen) {
      span.length = r.varint();
      span.offset = r.pos;
      span.ok = r.ok && span.dtype != 0;
      return span;
    } else {
      r.skip(wire);
    }
  }
  return span;
}

// The first `limit` bytes of a ByteBuffer, contiguous (a header may straddle slices).
inline std::string peek(const grpc::ByteBuffer& buffer, size_t limit) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& slice : slices) {
    size_t take = std::min(limit - out.size(), slice.size());
    out.append(reinterpret_cast<const char*>(slice.begin()), take);
    if (out.size() >= limit) break;
  }
  return out;
}

// Header bytes a TensorProto or a TensorChunk can carry before its data: generous.
constexpr size_t kPeekBytes = 256;

// Copy `length` bytes from `from` on of the message made of `slices` into `out`; false if the
// message is shorter.
inline bool copy_range(const std::vector<grpc::Slice>& slices, size_t from, size_t length,
                       uint8_t* out) {
  for (const grpc::Slice& slice : slices) {
    if (length == 0) break;
    if (from >= slice.size()) {
      from -= slice.size();
      continue;
    }
    size_t take = std::min(slice.size() - from, length);
    std::memcpy(out, slice.begin() + from, take);
    out += take;
    length -= take;
    from = 0;
  }
  return length == 0;
}

// A TensorChunk's data field: (prefix length, data length) of an encoded chunk.
struct ChunkSpan {
  bool ok = false;
  uint64_t prefix = 0;
  uint64_t length = 0;
};

inline ChunkSpan chunk_span(const grpc::ByteBuffer& buffer) {
  ChunkSpan span;
  std::string head = peek(buffer, 16);
  Reader r{reinterpret_cast<const uint8_t*>(head.data()), head.size()};
  if (buffer.Length() == 0) {  // an empty TensorChunk: no data
    span.ok = true;
    return span;
  }
  uint64_t key = r.varint();
  if (key != (1 << 3 | kLen)) return span;
  span.length = r.varint();
  span.prefix = r.pos;
  // Compared by subtraction: a length near 2^64 must not wrap into a match.
  span.ok = r.ok && span.prefix <= buffer.Length() && span.length == buffer.Length() - span.prefix;
  return span;
}

inline std::string chunk_prefix(uint64_t data_bytes) {
  std::string out;
  put_tag(&out, 1, kLen);
  put_varint(&out, data_bytes);
  return out;
}

inline std::string encode_ack(int64_t bytes_received, int64_t messages) {
  std::string out;
  put_varint_field(&out, 1, static_cast<uint64_t>(bytes_received));
  put_varint_field(&out, 2, static_cast<uint64_t>(messages));
  return out;
}

inline std::string encode_pull_request(int64_t nbytes, int dtype, int64_t chunk_bytes) {
  std::string out;
  put_varint_field(&out, 1, static_cast<uint64_t>(nbytes));
  put_varint_field(&out, 2, static_cast<uint64_t>(dtype));
  put_varint_field(&out, 3, static_cast<uint64_t>(chunk_bytes));
  return out;
}

inline grpc::ByteBuffer to_buffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

inline std::string to_string(const grpc::ByteBuffer& buffer) {
  return peek(buffer, buffer.Length());
}

}  // namespace tfgrpc
