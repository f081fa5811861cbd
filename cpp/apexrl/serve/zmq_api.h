// The few documented libzmq C-API calls the serving loop makes, bound at run time.
//
// pyzmq's wheel bundles libzmq under a hashed file name (pyzmq.libs/libzmq-<hash>.so.5), loads it privately
// (its symbols are not global) and ships no zmq.h. The extension therefore declares the ABI it needs here
// (stable across libzmq 4.x: a zmq_msg_t is 64 opaque bytes, zmq_pollitem_t is {socket, fd, events,
// revents}) and binds the functions with dlopen(path, RTLD_NOLOAD) of the exact library pyzmq loaded, so the
// socket Python hands over (Socket.underlying) is driven by the same libzmq that created it. Nothing is
// loaded that was not already in the process.
#ifndef APEXRL_SERVE_ZMQ_API_H_
#define APEXRL_SERVE_ZMQ_API_H_

#include <cstddef>
#include <string>

namespace apexrl::serve {

struct ZmqMsg {
  alignas(8) unsigned char opaque[64];  // zmq_msg_t
};

struct ZmqPollItem {  // zmq_pollitem_t on POSIX
  void* socket;
  int fd;
  short events;
  short revents;
};

inline constexpr int kZmqDontWait = 1;
inline constexpr int kZmqSndMore = 2;
inline constexpr short kZmqPollIn = 1;
inline constexpr int kZmqHausnumero = 156384712;
inline constexpr int kZmqETerm = kZmqHausnumero + 53;

using ZmqFreeFn = void(void* data, void* hint);

struct ZmqApi {
  int (*msg_init)(ZmqMsg*) = nullptr;
  int (*msg_init_size)(ZmqMsg*, size_t) = nullptr;
  int (*msg_init_data)(ZmqMsg*, void*, size_t, ZmqFreeFn*, void*) = nullptr;
  int (*msg_close)(ZmqMsg*) = nullptr;
  void* (*msg_data)(ZmqMsg*) = nullptr;
  size_t (*msg_size)(const ZmqMsg*) = nullptr;
  int (*msg_more)(const ZmqMsg*) = nullptr;
  const char* (*msg_gets)(const ZmqMsg*, const char*) = nullptr;
  int (*msg_recv)(ZmqMsg*, void*, int) = nullptr;
  int (*msg_send)(ZmqMsg*, void*, int) = nullptr;
  int (*poll)(ZmqPollItem*, int, long) = nullptr;
  int (*errno_)() = nullptr;
  const char* (*strerror)(int) = nullptr;
  void (*version)(int*, int*, int*) = nullptr;

  // Binds every function from the libzmq already loaded at `path` (RTLD_NOLOAD: never loads a second copy).
  // Throws std::runtime_error naming the path and the missing symbol or the loader's reason; requires
  // libzmq >= 4.2 (zmq_msg_gets with "User-Id", ZMQ_ROUTER_MANDATORY's EHOSTUNREACH).
  static ZmqApi Bind(const std::string& path);
};

}  // namespace apexrl::serve

#endif  // APEXRL_SERVE_ZMQ_API_H_
