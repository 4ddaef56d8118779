#pragma once
// What a replica leaves running outside its process group (`setsid cmd &`, a daemon's double
// fork) escapes the group kill when the replica ends. xla-spawn makes itself its replicas'
// subreaper (PR_SET_CHILD_SUBREAPER), so such processes become its children once their parent
// exits, and after each attempt it SIGKILLs and reaps every child that is not one of its own
// helpers (the reaper, the rendezvous server).
//
//   xs::become_subreaper();
//   ...attempt ends...
//   const int killed = xs::kill_orphans({reaper.pid()});

#include <sys/types.h>

#include <set>

namespace xs {

// Throws xs::IoError when the kernel refuses.
void become_subreaper();

// SIGKILLs (with their process groups, when they lead one) and reaps every child of this
// process not in `keep`, again while killing one hands this process its children, for at most
// a few rounds and about 2 s. Returns how many it killed or reaped.
int kill_orphans(const std::set<pid_t>& keep);

}  // namespace xs
