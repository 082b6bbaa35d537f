//! The seccomp filter of every run (docs/SPEC.md §12 "Kernel-enforced layers on top").
//!
//! A classic BPF program, built here (it allocates) and installed in the run's last process
//! before `execve` by [`Filter::install`] (two raw system calls: async-signal-safe). It decides
//! on the system call's number, its ABI and, for three calls, one argument:
//!
//! - a call of another ABI than the binary's own (32-bit x86 through `int 0x80`, whose numbers
//!   mean other calls; x32, whose numbers carry `__X32_SYSCALL_BIT`) answers `EPERM`;
//! - [`EPERM_CALLS`] answer `EPERM`: mounting (the old and the new mount API, including
//!   `fspick`, `open_tree`, `open_tree_attr` and `mount_setattr`, which §12 leaves unnamed but
//!   which belong to it: docs/PROTOCOL-NOTES.md SB3), `open_by_handle_at`, kernel modules and
//!   `kexec`, `bpf`, `perf_event_open`, `userfaultfd`, the key management calls, `reboot`,
//!   swap, `acct` and setting the clock;
//! - `ioctl` with the request `TIOCSTI` or `TIOCLINUX` answers `EPERM`, whatever the upper 32
//!   bits of the request hold (the kernel ignores them, so the filter compares the lower word);
//! - `clone` and `unshare` with `CLONE_NEWUSER` answer `EPERM` unless `sandbox.user_namespaces`;
//! - `clone3` and `io_uring_setup` answer `ENOSYS`: the C library then creates threads and
//!   processes with `clone`, whose flags the filter can read (`clone3`'s are behind a pointer),
//!   and libuv falls back from io_uring to its thread pool (io_uring's operations would pass by
//!   the filter);
//! - everything else is allowed.
//!
//! The filter cannot be undone and is inherited by every descendant of the run.

use crate::process::errno;

/// `SECCOMP_RET_ALLOW`.
const RET_ALLOW: u32 = 0x7fff_0000;
/// `SECCOMP_RET_ERRNO`, with the errno in the low 16 bits.
const RET_ERRNO: u32 = 0x0005_0000;

/// `AUDIT_ARCH_*` of the binary's own ABI: the only one whose calls the filter lets through.
#[cfg(target_arch = "x86_64")]
pub const NATIVE_ARCH: u32 = 0xC000_003E;
/// `AUDIT_ARCH_*` of the binary's own ABI: the only one whose calls the filter lets through.
#[cfg(target_arch = "aarch64")]
pub const NATIVE_ARCH: u32 = 0xC000_00B7;

/// `__X32_SYSCALL_BIT`: x32 calls arrive with `AUDIT_ARCH_X86_64` and this bit in the number.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// `open_tree_attr` (Linux 6.15; one number on every architecture), not in every `libc`.
const SYS_OPEN_TREE_ATTR: libc::c_long = 467;

/// `TIOCSTI`: push a byte into a terminal's input queue.
pub const TIOCSTI: u32 = 0x5412;
/// `TIOCLINUX`: the virtual console's multiplexer (its selection can be pasted as input).
pub const TIOCLINUX: u32 = 0x541C;

/// The system calls answered with `EPERM`, with their names (docs/SPEC.md §12).
pub const EPERM_CALLS: &[(&str, libc::c_long)] = &[
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("move_mount", libc::SYS_move_mount),
    ("fsopen", libc::SYS_fsopen),
    ("fsmount", libc::SYS_fsmount),
    ("fsconfig", libc::SYS_fsconfig),
    ("fspick", libc::SYS_fspick),
    ("open_tree", libc::SYS_open_tree),
    ("open_tree_attr", SYS_OPEN_TREE_ATTR),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("acct", libc::SYS_acct),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
];

/// The system calls answered with `ENOSYS` (so that callers fall back to ones the filter sees).
pub const ENOSYS_CALLS: &[(&str, libc::c_long)] = &[
    ("clone3", libc::SYS_clone3),
    ("io_uring_setup", libc::SYS_io_uring_setup),
];

// `struct seccomp_data`: nr (int) at 0, arch (u32) at 4, instruction_pointer at 8, args at 16.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;

/// The offset of the lower 32 bits of argument `i` in `struct seccomp_data`.
const fn arg_low(i: u32) -> u32 {
    if cfg!(target_endian = "little") {
        16 + 8 * i
    } else {
        16 + 8 * i + 4
    }
}

/// What the run may do that the filter otherwise refuses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// `sandbox.user_namespaces`: `clone` and `unshare` may ask for `CLONE_NEWUSER`.
    pub user_namespaces: bool,
}

/// A built filter (see the module header), ready for [`Filter::install`].
#[derive(Clone)]
pub struct Filter {
    program: Vec<libc::sock_filter>,
}

impl std::fmt::Debug for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Filter({} instructions)", self.program.len())
    }
}

/// Where a jump goes: the next instruction, a verdict, or a labelled block.
#[derive(Clone, Copy, PartialEq, Eq)]
enum To {
    Next,
    Allow,
    Eperm,
    Enosys,
    Ioctl,
    Flags,
}

/// One instruction before its jumps are resolved.
#[derive(Clone, Copy)]
enum Op {
    Load(u32),
    Jump(u16, u32, To, To),
    Ret(u32),
    Label(To),
}

impl Filter {
    /// The filter for a run with `options`.
    pub fn build(options: Options) -> Filter {
        let jeq = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
        let jge = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
        let jset = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
        let nr = |n: libc::c_long| n as u32;
        let mut ops = vec![
            Op::Load(OFF_ARCH),
            Op::Jump(jeq, NATIVE_ARCH, To::Next, To::Eperm),
            Op::Load(OFF_NR),
        ];
        #[cfg(target_arch = "x86_64")]
        ops.push(Op::Jump(jge, X32_SYSCALL_BIT, To::Eperm, To::Next));
        #[cfg(not(target_arch = "x86_64"))]
        let _ = jge;
        for (_, n) in EPERM_CALLS {
            ops.push(Op::Jump(jeq, nr(*n), To::Eperm, To::Next));
        }
        for (_, n) in ENOSYS_CALLS {
            ops.push(Op::Jump(jeq, nr(*n), To::Enosys, To::Next));
        }
        ops.push(Op::Jump(jeq, nr(libc::SYS_ioctl), To::Ioctl, To::Next));
        if !options.user_namespaces {
            ops.push(Op::Jump(jeq, nr(libc::SYS_clone), To::Flags, To::Next));
            ops.push(Op::Jump(jeq, nr(libc::SYS_unshare), To::Flags, To::Next));
        }
        ops.push(Op::Ret(RET_ALLOW));
        // ioctl(fd, request): the request's lower word.
        ops.push(Op::Label(To::Ioctl));
        ops.push(Op::Load(arg_low(1)));
        ops.push(Op::Jump(jeq, TIOCSTI, To::Eperm, To::Next));
        ops.push(Op::Jump(jeq, TIOCLINUX, To::Eperm, To::Allow));
        // clone(flags, …) and unshare(flags): flags is the first argument of both.
        ops.push(Op::Label(To::Flags));
        ops.push(Op::Load(arg_low(0)));
        ops.push(Op::Jump(
            jset,
            libc::CLONE_NEWUSER as u32,
            To::Eperm,
            To::Allow,
        ));
        ops.push(Op::Label(To::Allow));
        ops.push(Op::Ret(RET_ALLOW));
        ops.push(Op::Label(To::Eperm));
        ops.push(Op::Ret(RET_ERRNO | libc::EPERM as u32));
        ops.push(Op::Label(To::Enosys));
        ops.push(Op::Ret(RET_ERRNO | libc::ENOSYS as u32));
        Filter {
            program: assemble(&ops),
        }
    }

    /// The number of BPF instructions.
    pub fn len(&self) -> usize {
        self.program.len()
    }

    /// Whether the program is empty (never, for a built filter).
    pub fn is_empty(&self) -> bool {
        self.program.is_empty()
    }

    /// Install the filter on the calling thread (and so on everything it executes and starts):
    /// `prctl(PR_SET_NO_NEW_PRIVS)`, then `seccomp(SECCOMP_SET_MODE_FILTER)`. Raw system calls
    /// on memory built before the fork: async-signal-safe, no allocation. The last step before
    /// `execve`: the filter refuses the mounts and `pivot_root` the sandbox makes before it.
    ///
    /// # Errors
    /// The errno of the call that failed (`EINVAL`: a kernel without seccomp filters).
    pub fn install(&self) -> Result<(), i32> {
        let prog = libc::sock_fprog {
            len: self.program.len() as u16,
            filter: self.program.as_ptr().cast_mut(),
        };
        // SAFETY: prctl on integers; seccomp reads `prog` and the program it points to, both
        // alive for the call (the kernel copies the program).
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(errno());
            }
            if libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0u32,
                &prog as *const libc::sock_fprog,
            ) != 0
            {
                return Err(errno());
            }
        }
        Ok(())
    }
}

/// Resolve the labels of `ops` into relative jump offsets. The program is short (a few dozen
/// instructions), so every offset fits the 8 bits a conditional jump has.
fn assemble(ops: &[Op]) -> Vec<libc::sock_filter> {
    let mut at = Vec::new();
    let mut n = 0usize;
    for op in ops {
        match op {
            Op::Label(l) => at.push((*l, n)),
            _ => n += 1,
        }
    }
    let target = |to: To, here: usize| -> u8 {
        if to == To::Next {
            return 0;
        }
        let dest = at
            .iter()
            .find(|(l, _)| *l == to)
            .map(|(_, i)| *i)
            .unwrap_or(here + 1);
        u8::try_from(dest - here - 1).unwrap_or(u8::MAX)
    };
    let mut out = Vec::with_capacity(n);
    for op in ops {
        let here = out.len();
        let insn = match *op {
            Op::Label(_) => continue,
            Op::Load(k) => bpf((libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16, 0, 0, k),
            Op::Jump(code, k, t, f) => bpf(code, target(t, here), target(f, here), k),
            Op::Ret(k) => bpf((libc::BPF_RET | libc::BPF_K) as u16, 0, 0, k),
        };
        out.push(insn);
    }
    out
}

fn bpf(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// Whether this kernel takes seccomp filters (`CONFIG_SECCOMP_FILTER`): `PR_GET_SECCOMP`
/// answers instead of failing with `EINVAL`.
pub fn available() -> bool {
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) >= 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    /// Run `probe` in a forked child under `filter`; its exit code is the probe's result.
    /// The child makes raw system calls only (the test process has threads).
    fn under(filter: &Filter, probe: fn() -> i32) -> i32 {
        // SAFETY: fork; the child installs a prebuilt filter, makes raw system calls and
        // `_exit`s without touching any lock.
        unsafe {
            let pid = libc::fork();
            assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
            if pid == 0 {
                let code = match filter.install() {
                    Ok(()) => probe(),
                    Err(_) => 200,
                };
                libc::_exit(code);
            }
            let mut status = 0;
            assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
            assert!(libc::WIFEXITED(status), "child status {status:#x}");
            libc::WEXITSTATUS(status)
        }
    }

    /// The errno of a raw call's failure, 0 on success.
    fn outcome(r: libc::c_long) -> i32 {
        if r < 0 {
            errno()
        } else {
            0
        }
    }

    #[test]
    fn offsets_fit_and_the_program_ends_in_verdicts() {
        for user_namespaces in [false, true] {
            let f = Filter::build(Options { user_namespaces });
            assert!(f.len() < 100, "{f:?}");
            let ret = (libc::BPF_RET | libc::BPF_K) as u16;
            let last = &f.program[f.len() - 3..];
            assert!(last.iter().all(|i| i.code == ret));
            for (i, insn) in f.program.iter().enumerate() {
                if insn.code & 0x07 == libc::BPF_JMP as u16 {
                    for off in [insn.jt, insn.jf] {
                        let dest = i + 1 + usize::from(off);
                        assert!(dest < f.len(), "jump out of the program at {i}");
                        assert_ne!(off, u8::MAX, "unresolved label at {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn ordinary_calls_pass() {
        let f = Filter::build(Options::default());
        let code = under(&f, || {
            // SAFETY: raw calls with valid arguments.
            unsafe {
                if libc::syscall(libc::SYS_getpid) <= 0 {
                    return 1;
                }
                // A terminal ioctl other than TIOCSTI reaches the kernel (ENOTTY on a pipe-less
                // fd 0 of a test, or success): never EPERM.
                let mut ws: libc::winsize = std::mem::zeroed();
                let r = libc::syscall(libc::SYS_ioctl, 0, libc::TIOCGWINSZ, &mut ws);
                if r < 0 && errno() == libc::EPERM {
                    return 2;
                }
                // A plain fork (clone without CLONE_NEWUSER) works.
                let r = libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_long, 0, 0, 0, 0);
                if r == 0 {
                    libc::_exit(0);
                }
                if r < 0 {
                    return 3;
                }
                let mut st = 0;
                libc::waitpid(r as i32, &mut st, 0);
                // A new mount namespace is not a user namespace: the filter passes it (the
                // kernel refuses it without CAP_SYS_ADMIN; the test runs as root).
                let r = libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUTS);
                if r < 0 && errno() == libc::EPERM && libc::geteuid() == 0 {
                    return 4;
                }
            }
            0
        });
        assert_eq!(code, 0);
    }

    #[test]
    fn listed_calls_answer_eperm() {
        let f = Filter::build(Options::default());
        let code = under(&f, || {
            // Arguments that would fail otherwise with another errno (or succeed, as root).
            for (i, (_, n)) in EPERM_CALLS.iter().enumerate() {
                // SAFETY: every call gets zero arguments; the filter answers before the kernel
                // reads them.
                let r = unsafe { libc::syscall(*n, 0, 0, 0, 0, 0, 0) };
                if outcome(r) != libc::EPERM {
                    return 10 + i as i32;
                }
            }
            0
        });
        assert_eq!(code, 0, "the call at {} was not refused", code - 10);
    }

    #[test]
    fn clone3_and_io_uring_answer_enosys() {
        let f = Filter::build(Options::default());
        let code = under(&f, || {
            for (i, (_, n)) in ENOSYS_CALLS.iter().enumerate() {
                // SAFETY: zero arguments; refused before the kernel reads them.
                let r = unsafe { libc::syscall(*n, 0, 0, 0, 0) };
                if outcome(r) != libc::ENOSYS {
                    return 10 + i as i32;
                }
            }
            0
        });
        assert_eq!(code, 0);
    }

    #[test]
    fn tiocsti_and_tioclinux_refused_whatever_the_upper_bits() {
        let f = Filter::build(Options::default());
        let code = under(&f, || {
            let c: u8 = b'x';
            for (i, req) in [
                u64::from(TIOCSTI),
                u64::from(TIOCSTI) | 0xdead_beef_0000_0000,
                u64::from(TIOCLINUX),
                u64::from(TIOCLINUX) | 1 << 32,
            ]
            .into_iter()
            .enumerate()
            {
                // SAFETY: ioctl on fd 0 with a pointer to a byte; refused before the kernel.
                let r = unsafe { libc::syscall(libc::SYS_ioctl, 0, req, &c as *const u8) };
                if outcome(r) != libc::EPERM {
                    return 10 + i as i32;
                }
            }
            0
        });
        assert_eq!(code, 0);
    }

    #[test]
    fn new_user_namespaces_refused_unless_allowed() {
        let probe: fn() -> i32 = || {
            // SAFETY: unshare and clone with integer flags; a clone child exits at once.
            unsafe {
                let u = outcome(libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUSER));
                let r = libc::syscall(
                    libc::SYS_clone,
                    (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_long,
                    0,
                    0,
                    0,
                    0,
                );
                if r == 0 {
                    libc::_exit(0);
                }
                if r > 0 {
                    let mut st = 0;
                    libc::waitpid(r as i32, &mut st, 0);
                }
                let c = outcome(r);
                match (u, c) {
                    (libc::EPERM, libc::EPERM) => 1,
                    (0, 0) => 2,
                    _ => 3,
                }
            }
        };
        assert_eq!(under(&Filter::build(Options::default()), probe), 1);
        let allowed = Filter::build(Options {
            user_namespaces: true,
        });
        // Allowed by the filter: the kernel makes them (the test runs where user namespaces
        // work), or refuses with its own errno, never with the filter's pair of EPERMs.
        assert_ne!(under(&allowed, probe), 1);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn other_abis_refused() {
        let f = Filter::build(Options::default());
        let code = under(&f, || {
            // x32: getpid with __X32_SYSCALL_BIT (ENOSYS without the filter on a kernel
            // without x32, a pid with it).
            // SAFETY: a raw call with no arguments.
            let r = unsafe { libc::syscall(libc::SYS_getpid | X32_SYSCALL_BIT as libc::c_long) };
            if outcome(r) != libc::EPERM {
                return 1;
            }
            // i386 through int 0x80: getpid is 20 there.
            let mut ret: i64 = 20;
            // SAFETY: `int 0x80` with eax = 20 (getpid, no arguments); it clobbers nothing
            // but eax (r8-r11 are preserved by the compat entry, declared clobbered anyway).
            unsafe {
                std::arch::asm!(
                    "int 0x80",
                    inlateout("rax") ret,
                    out("r8") _, out("r9") _, out("r10") _, out("r11") _,
                );
            }
            if ret != -i64::from(libc::EPERM) {
                return 2;
            }
            0
        });
        assert_eq!(code, 0);
    }

    /// Run `argv` under `filter` (installed in `pre_exec`) and return its stdout, or why not.
    fn run_under(filter: &Filter, argv: &[&str]) -> Result<String, String> {
        use std::os::unix::process::CommandExt;
        let f = filter.clone();
        let mut cmd = std::process::Command::new(argv[0]);
        cmd.args(&argv[1..]);
        // SAFETY: the closure makes two raw system calls on the prebuilt program.
        unsafe {
            cmd.pre_exec(move || f.install().map_err(io::Error::from_raw_os_error));
        }
        let out = cmd.output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "{argv:?}: {} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    #[test]
    fn threads_posix_spawn_and_runtimes_work_under_it() {
        let f = Filter::build(Options::default());
        // bash forks (clone) and waits; coreutils' sort uses threads (pthread_create: clone3,
        // then clone after ENOSYS).
        let out = run_under(
            &f,
            &[
                "bash",
                "-c",
                "echo a & wait; printf 'b\\na\\n' | sort --parallel=4 -S 1M | tr -d '\\n'",
            ],
        );
        assert_eq!(out.as_deref(), Ok("a\nab"));
        // The runtimes agents are made of, where this host has them: threads, posix_spawn,
        // libuv's io_uring fallback.
        let cases: [(&str, &[&str], &str); 3] = [
            (
                "python3",
                &[
                    "python3",
                    "-c",
                    "import threading, subprocess; t = threading.Thread(target=print, \
                     args=('t',)); t.start(); t.join(); \
                     print(subprocess.run(['true']).returncode)",
                ],
                "t\n0\n",
            ),
            (
                "node",
                &[
                    "node",
                    "-e",
                    "const {execFileSync} = require('child_process'); \
                     require('fs').readFile('/etc/hostname', () => \
                     console.log(execFileSync('echo', ['n']).toString().trim()))",
                ],
                "n\n",
            ),
            ("git", &["git", "--version"], "git version"),
        ];
        for (prog, argv, want) in cases {
            let found = std::env::var_os("PATH")
                .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()));
            if !found {
                eprintln!("{prog} not installed: not tried");
                continue;
            }
            let out = run_under(&f, argv);
            assert!(
                out.as_deref().is_ok_and(|o| o.starts_with(want)),
                "{prog}: {out:?}"
            );
        }
    }
}
