#pragma once
// The start of a process xla-spawn forks to work beside it (the reaper, the rendezvous
// server): it ignores the terminal's and the job's signals (xla-spawn handles those and tells
// the helper what to do, or its death does), names itself for ps, and keeps only stderr and
// one descriptor of its own, so it holds none of the launcher's other files (a console pipe
// kept open would delay the reader's EOF).
//
//   const int fd = xs::isolate_helper_process("xla-spawn-reap", pipe_read_end);   // now 3

namespace xs {

// In the forked child, before anything else: SIGINT, SIGTERM, SIGHUP, SIGQUIT and SIGPIPE
// ignored; `keep_fd` moved to 3; every other descriptor above 2 closed; stdin and stdout on
// /dev/null. Returns 3; _exits(1) if the move fails.
int isolate_helper_process(const char* name, int keep_fd);

}  // namespace xs
