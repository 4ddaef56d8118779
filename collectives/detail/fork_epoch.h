#pragma once
// How many times this process's ancestors forked it, counted in the children by a
// pthread_atfork handler: shared-memory state (a communicator's rounds, registered buffers)
// belongs to the process that made it, and a forked child tells itself apart by comparing
// this count, without a system call.
//
//   const uint64_t mine = fork_epoch();             // at construction
//   if (fork_epoch() != mine) throw ...;            // in a forked child

#include <cstdint>

namespace xs::detail {

uint64_t fork_epoch();

}  // namespace xs::detail
