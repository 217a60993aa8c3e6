//! A seccomp filter for a child process, installed between fork and exec: the sandboxes
//! that deny io_uring (a container runtime's default profile, a systemd unit's
//! `SystemCallFilter=`), reproduced for one command.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Makes the child's `io_uring_setup` fail with `errno` (a seccomp filter installed
/// between fork and exec; everything else is allowed).
pub fn deny_io_uring_setup(cmd: &mut Command, errno: i32) {
    let hook = move || -> std::io::Result<()> {
        const RET_ALLOW: u32 = 0x7fff_0000;
        const RET_ERRNO: u32 = 0x0005_0000;
        let filter = [
            // A = seccomp_data.nr
            libc::sock_filter {
                code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
                jt: 0,
                jf: 0,
                k: 0,
            },
            libc::sock_filter {
                code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
                jt: 0,
                jf: 1,
                k: libc::SYS_io_uring_setup as u32,
            },
            libc::sock_filter {
                code: (libc::BPF_RET | libc::BPF_K) as u16,
                jt: 0,
                jf: 0,
                k: RET_ERRNO | (errno as u32 & 0xffff),
            },
            libc::sock_filter {
                code: (libc::BPF_RET | libc::BPF_K) as u16,
                jt: 0,
                jf: 0,
                k: RET_ALLOW,
            },
        ];
        let prog = libc::sock_fprog {
            len: filter.len() as u16,
            filter: filter.as_ptr() as *mut libc::sock_filter,
        };
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &prog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    };
    // SAFETY: the hook only builds a value on the stack and makes two prctl calls, which
    // is allowed between fork and exec.
    unsafe {
        cmd.pre_exec(hook);
    }
}
