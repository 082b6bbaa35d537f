//! The remote mount's listener (docs/SPEC.md §13) on loopback, without a kernel: the test plays
//! the node's kernel, sending FUSE frames it encodes itself over a real TLS connection to a
//! real listener, and attacks it: forged, replayed and expired secrets (also an ended run's
//! ticket replayed), a certificate other than the pinned one, garbage, truncated and
//! undecodable frames (also 60 connections fuzzed with random ones beside a bystander), an
//! unknown opcode, node ids never looked up, another connection's handle.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use smithfs::remote::channel::Channel;
use smithfs::remote::client::{attach, AttachError};
use smithfs::remote::keys::{Grant, Secret, Ticket};
use smithfs::remote::listener::{Listener, ListenerOptions};
use smithfs::remote::oob::{self, ExitReport};
use smithfs::remote::tls;
use smithfs::trigger::Trigger;

use crate::world::{World, CHILD_DIR};

const LOOKUP: u32 = 1;
const FORGET: u32 = 2;
const GETATTR: u32 = 3;
const OPEN: u32 = 14;
const READ: u32 = 15;
const WRITE: u32 = 16;
const RELEASE: u32 = 18;
const CREATE: u32 = 35;
const INIT: u32 = 26;
const SETXATTR: u32 = 21;
const REMOVEXATTR: u32 = 24;
const T: Duration = Duration::from_secs(10);

fn listener(w: &World) -> Listener {
    let id = tls::Identity::generate().unwrap();
    Listener::start(
        w.fs.clone(),
        ListenerOptions {
            listen: "127.0.0.1:0".into(),
            advertise: None,
            mount_point: "/mnt/tree".into(),
            // SAFETY: no preconditions.
            run_uid: unsafe { libc::geteuid() },
            // SAFETY: no preconditions.
            run_gid: unsafe { libc::getegid() },
        },
        &id,
        None,
    )
    .unwrap()
}

/// A connected node: the channel and the next request id.
struct Node {
    ch: Channel,
    unique: u64,
    /// Notifications received while waiting for replies: (code, body).
    notes: Vec<(i32, Vec<u8>)>,
}

impl Node {
    fn new(t: &Ticket) -> Node {
        let a = attach(t).unwrap();
        assert_eq!(a.mount_point, "/mnt/tree");
        Node {
            ch: a.channel,
            unique: 1,
            notes: Vec::new(),
        }
    }

    fn frame(&mut self, opcode: u32, nodeid: u64, arg: &[u8], payload: &[u8]) -> Vec<u8> {
        self.unique += 1;
        let len = 40 + arg.len() + payload.len();
        let mut f = Vec::with_capacity(len);
        f.extend_from_slice(&(len as u32).to_ne_bytes());
        f.extend_from_slice(&opcode.to_ne_bytes());
        f.extend_from_slice(&self.unique.to_ne_bytes());
        f.extend_from_slice(&nodeid.to_ne_bytes());
        // uid, gid, pid: lies the daemon must ignore (root, pid 1).
        f.extend_from_slice(&0u32.to_ne_bytes());
        f.extend_from_slice(&0u32.to_ne_bytes());
        f.extend_from_slice(&1u32.to_ne_bytes());
        f.extend_from_slice(&[0u8; 4]);
        f.extend_from_slice(arg);
        f.extend_from_slice(payload);
        f
    }

    /// Send a request, return (error, body) of its reply.
    fn call(&mut self, opcode: u32, nodeid: u64, arg: &[u8], payload: &[u8]) -> (i32, Vec<u8>) {
        let f = self.frame(opcode, nodeid, arg, payload);
        self.ch.send(&f).unwrap();
        self.ch.flush_all(T).unwrap();
        let want = self.unique;
        loop {
            let (error, unique, body) = self.read_frame().expect("a reply");
            if unique == 0 {
                self.notes.push((error, body));
                continue;
            }
            assert_eq!(unique, want);
            return (error, body);
        }
    }

    fn read_frame(&mut self) -> std::io::Result<(i32, u64, Vec<u8>)> {
        let h = self.ch.read_exact(16, T)?;
        let len = u32::from_ne_bytes(h[0..4].try_into().unwrap()) as usize;
        let error = i32::from_ne_bytes(h[4..8].try_into().unwrap());
        let unique = u64::from_ne_bytes(h[8..16].try_into().unwrap());
        let body = self.ch.read_exact(len - 16, T)?;
        Ok((error, unique, body))
    }

    fn lookup(&mut self, dir: u64, name: &str) -> Result<u64, i32> {
        let (e, body) = self.call(LOOKUP, dir, &[], &cstr(name));
        if e != 0 {
            return Err(-e);
        }
        Ok(u64_at(&body, 0))
    }

    fn walk(&mut self, path: &str) -> u64 {
        let mut n = 1;
        for part in path.split('/') {
            n = self.lookup(n, part).unwrap();
        }
        n
    }

    /// CREATE `name` in `dir` for writing: (node, fh) or -errno.
    fn create(&mut self, dir: u64, name: &str) -> Result<(u64, u64), i32> {
        let mut arg = Vec::new();
        for v in [
            (libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC) as u32,
            0o644,
            0o022,
            0,
        ] {
            arg.extend_from_slice(&v.to_ne_bytes());
        }
        let (e, body) = self.call(CREATE, dir, &arg, &cstr(name));
        if e != 0 {
            return Err(-e);
        }
        Ok((u64_at(&body, 0), u64_at(&body, 128)))
    }

    fn open(&mut self, node: u64, flags: i32) -> Result<u64, i32> {
        let mut arg = (flags as u32).to_ne_bytes().to_vec();
        arg.extend_from_slice(&[0u8; 4]);
        let (e, body) = self.call(OPEN, node, &arg, &[]);
        if e != 0 {
            return Err(-e);
        }
        Ok(u64_at(&body, 0))
    }

    fn write(&mut self, node: u64, fh: u64, data: &[u8]) -> i32 {
        let mut arg = Vec::new();
        arg.extend_from_slice(&fh.to_ne_bytes());
        arg.extend_from_slice(&0u64.to_ne_bytes());
        arg.extend_from_slice(&(data.len() as u32).to_ne_bytes());
        arg.extend_from_slice(&[0u8; 20]);
        self.call(WRITE, node, &arg, data).0
    }

    fn read(&mut self, node: u64, fh: u64) -> Result<Vec<u8>, i32> {
        let mut arg = Vec::new();
        arg.extend_from_slice(&fh.to_ne_bytes());
        arg.extend_from_slice(&0u64.to_ne_bytes());
        arg.extend_from_slice(&4096u32.to_ne_bytes());
        arg.extend_from_slice(&[0u8; 20]);
        let (e, body) = self.call(READ, node, &arg, &[]);
        if e != 0 {
            return Err(-e);
        }
        Ok(body)
    }

    fn release(&mut self, node: u64, fh: u64) -> i32 {
        let mut arg = fh.to_ne_bytes().to_vec();
        arg.extend_from_slice(&[0u8; 16]);
        self.call(RELEASE, node, &arg, &[]).0
    }

    /// SETXATTR `name` = `value` on `node` (the compat 8-byte argument: size, flags).
    fn setxattr(&mut self, node: u64, name: &str, value: &[u8]) -> i32 {
        let mut arg = (value.len() as u32).to_ne_bytes().to_vec();
        arg.extend_from_slice(&0u32.to_ne_bytes());
        let mut payload = cstr(name);
        payload.extend_from_slice(value);
        self.call(SETXATTR, node, &arg, &payload).0
    }

    fn getattr(&mut self, node: u64) -> i32 {
        self.call(GETATTR, node, &[0u8; 16], &[]).0
    }

    /// Send raw bytes and wait for the daemon to close the connection (no reply comes).
    fn expect_closed_after(mut self, bytes: &[u8]) {
        self.ch.send(bytes).unwrap();
        self.ch.flush_all(T).unwrap();
        match self.read_frame() {
            Err(e) => assert_ne!(e.kind(), std::io::ErrorKind::TimedOut, "closed, not hung"),
            Ok(f) => panic!("the connection stayed open and answered {f:?}"),
        }
    }
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().unwrap())
}

/// Poll `f` until it holds or 10 s pass.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + T;
    while !f() {
        assert!(Instant::now() < end, "never: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_connection_is_its_runs_smith_whatever_its_headers_say() {
    let w = World::new();
    let l = listener(&w);
    let mut n = Node::new(&l.ticket("run-1", w.child).unwrap());
    // The headers claim root and pid 1 (the operator, locally): judged as the child all the same.
    let outbox = n.walk(&format!("{CHILD_DIR}/outbox"));
    let (node, fh) = n.create(outbox, "result.md").unwrap();
    assert_eq!(n.write(node, fh, b"42\n"), 0);
    w.take_triggers();
    assert_eq!(n.release(node, fh), 0);
    // The close after the write completes the result, as a local one does (§5).
    let t = w.take_triggers();
    assert!(
        t.iter()
            .any(|t| matches!(t, Trigger::ResultPublished { smith } if *smith == w.child)),
        "{t:?}"
    );
    assert_eq!(
        std::fs::read(w.store(&format!("{CHILD_DIR}/outbox/result.md"))).unwrap(),
        b"42\n"
    );
    // The parent's outbox is not the child's to write.
    let parent_outbox = n.walk("smiths/smith-root/outbox");
    assert_eq!(n.create(parent_outbox, "result.md"), Err(libc::EACCES));
    // Nor is the operator's config.
    assert_eq!(n.create(1, "config.json"), Err(libc::EACCES));
}

/// A node has no kernel in front of the daemon to stop what only a privileged process may do:
/// file capabilities (`security.capability`: a program in the store that makes whoever runs it
/// root once the store is a plain directory again) and the `trusted.*` namespace are refused
/// to it as the node's own kernel refuses them to an unprivileged process, and POSIX ACLs as a
/// local kernel refuses them on this mount (notes XT26); `user.*` stays its own.
#[test]
fn a_node_cannot_set_file_capabilities_or_trusted_xattrs() {
    let w = World::new();
    let l = listener(&w);
    let mut n = Node::new(&l.ticket("run-1", w.child).unwrap());
    let outbox = n.walk(&format!("{CHILD_DIR}/outbox"));
    let (node, fh) = n.create(outbox, "prog").unwrap();
    assert_eq!(n.release(node, fh), 0);
    // VFS_CAP_REVISION_2, cap_setuid|cap_setgid|cap_dac_override permitted, effective.
    let mut cap = 0x0200_0001u32.to_le_bytes().to_vec();
    for v in [(1u32 << 1) | (1 << 6) | (1 << 7), 0, 0, 0] {
        cap.extend_from_slice(&v.to_le_bytes());
    }
    for name in [
        "security.capability",
        "security.evil",
        "trusted.overlay.opaque",
    ] {
        assert_eq!(n.setxattr(node, name, &cap), -libc::EPERM, "{name}");
        let (e, _) = n.call(REMOVEXATTR, node, &[], &cstr(name));
        assert_eq!(e, -libc::EPERM, "remove {name}");
    }
    // ACLs: the mount does not offer them, a local kernel answers EOPNOTSUPP itself.
    let acl = [2u8, 0, 0, 0, 1, 0, 7, 0, 0xff, 0xff, 0xff, 0xff];
    assert_eq!(
        n.setxattr(node, "system.posix_acl_access", &acl),
        -libc::EOPNOTSUPP
    );
    assert_eq!(n.setxattr(node, "user.note", b"mine"), 0);
    let path = w.store(&format!("{CHILD_DIR}/outbox/prog"));
    let mut names = vec![0u8; 1024];
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path and `names` a buffer of its length.
    let len = unsafe { libc::listxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(len >= 0, "listxattr: {}", std::io::Error::last_os_error());
    names.truncate(len as usize);
    assert_eq!(
        String::from_utf8_lossy(&names),
        "user.note\0",
        "only user.note in the store"
    );
}

#[test]
fn forged_replayed_and_expired_secrets_are_refused() {
    let w = World::new();
    let l = listener(&w);
    let good = l.ticket("run-1", w.child).unwrap();
    let mut forged = good.clone();
    forged.secret = Secret::random().unwrap();
    assert!(matches!(attach(&forged), Err(AttachError::Refused(_))));
    let mut other_run = good.clone();
    other_run.run_id = "run-2".into();
    assert!(matches!(attach(&other_run), Err(AttachError::Refused(_))));
    // A forged attempt does not spend the secret; the first real use does.
    let mut n = Node::new(&good);
    assert!(n.lookup(1, "smiths").is_ok());
    assert!(matches!(attach(&good), Err(AttachError::Refused(_))));
    // The run is over: its connection is cut, and its secret refused from then on.
    l.keys().revoke("run-1", Duration::ZERO);
    let f = n.frame(GETATTR, 1, &[0u8; 16], &[]);
    let _ = n.ch.send(&f);
    let _ = n.ch.flush_all(T);
    assert!(
        n.read_frame().is_err(),
        "the revoked run's connection is cut"
    );
    let again = l.ticket("run-3", w.child).unwrap();
    l.keys().revoke("run-3", Duration::ZERO);
    assert!(matches!(attach(&again), Err(AttachError::Refused(_))));
}

#[test]
fn only_the_pinned_certificate_is_trusted() {
    let w = World::new();
    let l = listener(&w);
    let mut t = l.ticket("run-1", w.child).unwrap();
    t.pin[0] ^= 1;
    assert!(matches!(attach(&t), Err(AttachError::Unreachable { .. })));
}

#[test]
fn garbage_truncated_and_undecodable_frames_close_the_connection() {
    let w = World::new();
    let l = listener(&w);
    // Not TLS at all.
    let mut raw = TcpStream::connect(l.addr()).unwrap();
    raw.set_read_timeout(Some(T)).unwrap();
    raw.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut buf = [0u8; 64];
    let got = std::io::Read::read(&mut raw, &mut buf);
    assert!(
        matches!(got, Ok(_) | Err(_)),
        "answered with an alert or closed"
    );
    // A length below the header, above the bound, an undecodable LOOKUP (no NUL), a frame cut
    // short by the end of the stream.
    let mut k = 0;
    let mut next = || {
        k += 1;
        Node::new(&l.ticket(&format!("run-{k}"), w.child).unwrap())
    };
    next().expect_closed_after(&[8, 0, 0, 0, 1, 0, 0, 0]);
    next().expect_closed_after(&u32::MAX.to_ne_bytes());
    let mut n = next();
    let bad = n.frame(LOOKUP, 1, &[], b"no-nul");
    n.expect_closed_after(&bad);
    let mut n = next();
    let mut cut = n.frame(WRITE, 1, &[0u8; 40], &[7u8; 100]);
    cut.truncate(90);
    n.ch.send(&cut).unwrap();
    n.ch.flush_all(T).unwrap();
    n.ch.close();
    // The server is still serving others.
    let mut n = next();
    assert!(n.lookup(1, "smiths").is_ok());
    eventually("the closed connections are gone", || l.peers().len() == 1);
}

/// docs/PROTOCOL-NOTES.md R16: a node's output frames reach the run's output pipe in order, its
/// exit report is kept for the launcher (and given back by revoke); output after the report, a
/// second report, a bad exit body, an oversized output or a non-zero header field closes the
/// connection like any malformed frame, and nothing of it reaches the pipe.
#[test]
fn output_and_the_exit_report_cross_out_of_band_and_bad_ones_close_the_connection() {
    let w = World::new();
    let l = listener(&w);
    let (out_r, out_w) = nix::unistd::pipe().unwrap();
    let output = read_all(out_r);
    let mut n = Node::new(
        &l.ticket_with("run-1", w.child, Grant::default(), Some(out_w))
            .unwrap(),
    );
    for part in [&b"one\n"[..], b"two", b"\nthree\n"] {
        n.ch.send(&oob::output(part)).unwrap();
    }
    // FUSE requests go on between them, answered as ever (out-of-band frames have no reply).
    assert!(n.lookup(1, "smiths").is_ok());
    n.ch.send(&oob::exit(ExitReport::Signal(15))).unwrap();
    n.ch.flush_all(T).unwrap();
    eventually("the report arrived", || l.keys().report("run-1").is_some());
    assert!(l.keys().claimed("run-1"));
    // Output after the report is malformed.
    n.expect_closed_after(&oob::output(b"late"));
    assert_eq!(
        l.keys().revoke("run-1", T),
        Some(ExitReport::Signal(15)),
        "revoke gives the report back"
    );
    assert_eq!(output.join().unwrap(), "one\ntwo\nthree\n");
    // Every other malformed out-of-band frame closes its connection.
    let mut k = 1;
    let mut next = || {
        k += 1;
        Node::new(&l.ticket(&format!("run-{k}"), w.child).unwrap())
    };
    let mut twice = oob::exit(ExitReport::Code(0));
    twice.extend_from_slice(&oob::exit(ExitReport::Code(1)));
    next().expect_closed_after(&twice);
    let mut bad_kind = oob::exit(ExitReport::Code(0));
    bad_kind[40] = 9;
    next().expect_closed_after(&bad_kind);
    let mut header = oob::output(b"x");
    header[8] = 1;
    next().expect_closed_after(&header);
    let mut big = oob::output(&[b'x'; oob::MAX_OUTPUT]);
    big.push(b'x');
    let len = big.len() as u32;
    big[..4].copy_from_slice(&len.to_ne_bytes());
    next().expect_closed_after(&big);
    let mut empty = oob::output(b"x");
    empty.pop();
    empty[..4].copy_from_slice(&40u32.to_ne_bytes());
    next().expect_closed_after(&empty);
    // The server is still serving others.
    let mut n = next();
    assert!(n.lookup(1, "smiths").is_ok());
}

#[test]
fn an_unknown_opcode_is_enosys_and_init_is_not_forwarded() {
    let w = World::new();
    let l = listener(&w);
    let mut n = Node::new(&l.ticket("run-1", w.child).unwrap());
    assert_eq!(n.call(9999, 1, &[], &[]).0, -libc::ENOSYS);
    assert_eq!(n.call(INIT, 0, &[0u8; 64], &[]).0, -libc::ENOSYS);
    assert!(n.lookup(1, "smiths").is_ok(), "still served");
}

#[test]
fn node_ids_and_handles_are_per_connection() {
    let w = World::new();
    let l = listener(&w);
    let mut a = Node::new(&l.ticket("run-a", w.child).unwrap());
    let mut b = Node::new(&l.ticket("run-b", w.child).unwrap());
    let private = a.walk(&format!("{CHILD_DIR}/private"));
    let (file, fh) = a.create(private, "f").unwrap();
    assert_eq!(a.write(file, fh, b"secret"), 0);
    // B never looked these up: ESTALE, whatever node id it guesses.
    assert_eq!(b.getattr(file), -libc::ESTALE);
    assert_eq!(b.getattr(private), -libc::ESTALE);
    assert_eq!(b.getattr(123_456), -libc::ESTALE);
    // B looks the file up itself, then tries A's handle: EBADF.
    let bfile = b.walk(&format!("{CHILD_DIR}/private/f"));
    assert_eq!(bfile, file, "node ids are the daemon's");
    assert_eq!(b.read(file, fh), Err(libc::EBADF));
    assert_eq!(b.write(file, fh, b"x"), -libc::EBADF);
    assert_eq!(b.release(file, fh), -libc::EBADF);
    // Its own handle works; A's is still A's.
    let bfh = b.open(file, libc::O_RDONLY).unwrap();
    assert_eq!(b.read(file, bfh).unwrap(), b"secret");
    assert_eq!(a.release(file, fh), 0);
    assert_eq!(
        a.release(file, fh),
        -libc::EBADF,
        "released: no longer held"
    );
    // A FORGET gives back no more than the connection holds; then the node is not A's.
    let mut arg = u64::MAX.to_ne_bytes().to_vec();
    arg.truncate(8);
    let f = a.frame(FORGET, file, &arg, &[]);
    a.ch.send(&f).unwrap();
    assert_eq!(a.getattr(file), -libc::ESTALE);
    assert_eq!(b.getattr(file), 0, "B's lookups are B's");
}

/// A control file's handle may have the number of a file's (the daemon numbers them apart): the
/// connection holds each with its node (docs/PROTOCOL-NOTES.md R55). A run writing its result
/// that read `.smithfs/whoami` meanwhile lost its result's handle — every later write EBADF —
/// once whoami's handle of the same number was released (found by tests/e2e/hardening.rs's
/// escapes.sh through a loopback run).
#[test]
fn a_control_files_handle_never_takes_a_files_place() {
    let w = World::new();
    let l = listener(&w);
    let mut a = Node::new(&l.ticket("run-a", w.child).unwrap());
    let private = a.walk(&format!("{CHILD_DIR}/private"));
    let (file, fh) = a.create(private, "result").unwrap();
    assert_eq!(a.write(file, fh, b"one"), 0);
    let whoami = a.walk(".smithfs/whoami");
    let mut same = None;
    let mut others = Vec::new();
    for _ in 0..64 {
        let cfh = a.open(whoami, libc::O_RDONLY).unwrap();
        if cfh == fh {
            same = Some(cfh);
            break;
        }
        others.push(cfh);
    }
    let cfh = same.expect("a control handle numbered as the file's");
    assert!(a.read(whoami, cfh).unwrap().starts_with(b"identity: "));
    assert_eq!(a.release(whoami, cfh), 0);
    assert_eq!(a.write(file, fh, b"two"), 0, "the file's handle survived");
    assert_eq!(a.read(whoami, cfh), Err(libc::EBADF), "released");
    assert_eq!(a.release(file, fh), 0);
    for o in others {
        assert_eq!(a.release(whoami, o), 0);
    }
}

#[test]
fn a_dropped_connection_forgets_what_it_held_and_publishes_nothing() {
    let w = World::new();
    let l = listener(&w);
    let base = w.fs.counts();
    let mut n = Node::new(&l.ticket("run-1", w.child).unwrap());
    let outbox = n.walk(&format!("{CHILD_DIR}/outbox"));
    let (node, fh) = n.create(outbox, "result.md").unwrap();
    assert_eq!(n.write(node, fh, b"half"), 0);
    let dir = n.walk(CHILD_DIR);
    assert!(n.lookup(dir, "inbox").is_ok());
    w.take_triggers();
    drop(n);
    eventually(
        "the connection's handles and lookups are given back",
        || w.fs.counts() == base,
    );
    let t = w.take_triggers();
    assert!(
        !t.iter()
            .any(|t| matches!(t, Trigger::ResultPublished { .. })),
        "a writer cut off mid-write publishes nothing: {t:?}"
    );
}

#[test]
fn a_change_over_one_connection_is_pushed_to_the_others() {
    let w = World::new();
    let l = listener(&w);
    let mut a = Node::new(&l.ticket("run-a", w.child).unwrap());
    let mut b = Node::new(&l.ticket("run-b", w.child).unwrap());
    let private = a.walk(&format!("{CHILD_DIR}/private"));
    assert_eq!(b.walk(&format!("{CHILD_DIR}/private")), private);
    let (file, fh) = a.create(private, "new").unwrap();
    assert_eq!(a.write(file, fh, b"x"), 0);
    // B's next reply comes after the notifications queued before it.
    assert_eq!(b.getattr(private), 0);
    let entry = b.notes.iter().any(|(code, body)| {
        *code == 3 && u64_at(body, 0) == private && body[16..].starts_with(b"new\0")
    });
    let data = b
        .notes
        .iter()
        .any(|(code, body)| *code == 2 && u64_at(body, 0) == file && u64_at(body, 8) == 0);
    assert!(entry && data, "{:?}", b.notes);
    assert!(
        a.notes.is_empty(),
        "not echoed to its author: {:?}",
        a.notes
    );
}

/// The listener of `w` serving at `mount_point` (the path `attach` mounts at).
fn listener_at(w: &World, mount_point: &std::path::Path) -> Listener {
    let id = tls::Identity::generate().unwrap();
    Listener::start(
        w.fs.clone(),
        ListenerOptions {
            listen: "127.0.0.1:0".into(),
            advertise: None,
            mount_point: mount_point.to_path_buf(),
            // SAFETY: no preconditions.
            run_uid: unsafe { libc::geteuid() },
            // SAFETY: no preconditions.
            run_gid: unsafe { libc::getegid() },
        },
        &id,
        None,
    )
    .unwrap()
}

/// `smithfs attach --cwd CWD -- bash -c SCRIPT` with `ticket` on descriptor 3, stdout piped.
fn spawn_attach(ticket: &Ticket, cwd: &std::path::Path, script: &str) -> std::process::Child {
    spawn_attach_as(None, ticket, cwd, script)
}

/// [`spawn_attach`] as `user` (uid, gid; no supplementary group) when given.
fn spawn_attach_as(
    user: Option<(u32, u32)>,
    ticket: &Ticket,
    cwd: &std::path::Path,
    script: &str,
) -> std::process::Child {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let (r, w) = nix::unistd::pipe().unwrap();
    std::fs::File::from(w)
        .write_all(ticket.to_text().as_bytes())
        .unwrap();
    let raw = r.as_raw_fd();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_smithfs"));
    cmd.args(["attach", "--ticket-fd", "3", "--cwd"])
        .arg(cwd)
        .args(["--", "bash", "-c", script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if let Some((uid, gid)) = user {
        // From root, std's spawn also drops every supplementary group.
        cmd.uid(uid).gid(gid);
    }
    // SAFETY: dup2 and fcntl are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(raw, 3) < 0 || libc::fcntl(3, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    drop(r);
    child
}

/// Everything read from `r` until its end of file, on a thread of its own.
fn read_all(r: std::os::fd::OwnedFd) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut std::fs::File::from(r), &mut s);
        s
    })
}

/// Kills `attach` if a test fails before it ended (its mount is in its own namespace: it goes
/// with it).
struct Reap(std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Read what `attach` writes until it exits: (status, stdout, stderr).
fn finish(c: &mut Reap) -> (std::process::ExitStatus, String, String) {
    let mut err = c.0.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let mut out = String::new();
    std::io::Read::read_to_string(&mut c.0.stdout.take().unwrap(), &mut out).unwrap();
    let status = c.0.wait().unwrap();
    (status, out, reader.join().unwrap())
}

fn root() -> bool {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn attach_runs_bash_coreutils_and_git_in_a_real_mount_over_loopback() {
    if !root() {
        eprintln!("skipped: attach mounts in a mount namespace of its own (root)");
        return;
    }
    let w = World::new();
    let mnt = tempfile::tempdir().unwrap();
    let l = listener_at(&w, mnt.path());
    let (out_r, out_w) = nix::unistd::pipe().unwrap();
    let ticket = l
        .ticket_with("run-attach", w.child, Grant::default(), Some(out_w))
        .unwrap();
    let output = read_all(out_r);
    let smith_dir = mnt.path().join(CHILD_DIR);
    let script = r#"set -e
        test "$(pwd)" = "$SMITH_DIR"
        cd private
        echo hello > a.txt && cat a.txt
        mkdir -p d/e && touch d/e/f && ls d/e
        seq 1 20000 > big && wc -l < big
        git init -q repo && cd repo
        git -c user.email=t@t -c user.name=t commit -q --allow-empty -m one
        echo x > x && git add x && git -c user.email=t@t -c user.name=t commit -q -m two
        git log --oneline | wc -l
        git status --porcelain | wc -l
        cd ../..
        if echo no > ../../outbox/result.md 2>/dev/null; then echo WROTE-PARENT; fi
        echo 42 > outbox/result.md
        echo done"#;
    let child = spawn_attach(
        &ticket,
        &smith_dir,
        &script.replace("$SMITH_DIR", &smith_dir.to_string_lossy()),
    );
    let mut child = Reap(child);
    let (status, own, stderr) = finish(&mut child);
    // COMMAND's output and its exit report came over the connection (notes R16).
    let report = l.keys().revoke("run-attach", T);
    let stdout = output.join().unwrap();
    assert!(status.success(), "{stdout}\n{stderr}");
    assert_eq!(report, Some(ExitReport::Code(0)));
    assert_eq!(own, "", "nothing of COMMAND's on attach's own stdout");
    // stdout and stderr are one stream, as a local run's: bash's complaint is in it.
    let (denied, lines): (Vec<&str>, Vec<&str>) = stdout
        .lines()
        .partition(|l| l.contains("Permission denied"));
    assert_eq!(lines, ["hello", "f", "20000", "2", "0", "done"], "{stderr}");
    assert_eq!(denied.len(), 1, "{stdout}");
    // Everything went through the daemon into its store.
    let store = |p: &str| w.store(&format!("{CHILD_DIR}/{p}"));
    assert_eq!(std::fs::read(store("private/a.txt")).unwrap(), b"hello\n");
    assert!(store("private/repo/.git/HEAD").exists());
    assert_eq!(std::fs::read(store("outbox/result.md")).unwrap(), b"42\n");
    // The result's close crossed before attach ended: it completed as a local one does.
    let t = w.take_triggers();
    assert!(
        t.iter()
            .any(|t| matches!(t, Trigger::ResultPublished { smith } if *smith == w.child)),
        "{t:?}"
    );
    // The daemon's store outside the mount namespace has no mount over it.
    assert!(!mnt.path().join("smiths").exists());
}

#[test]
fn a_dropped_connection_fails_the_remote_mount_closed() {
    if !root() {
        eprintln!("skipped: attach mounts in a mount namespace of its own (root)");
        return;
    }
    let w = World::new();
    let mnt = tempfile::tempdir().unwrap();
    let flag_dir = tempfile::tempdir().unwrap();
    let flag = flag_dir.path().join("go");
    let l = listener_at(&w, mnt.path());
    let (out_r, out_w) = nix::unistd::pipe().unwrap();
    let ticket = l
        .ticket_with("run-drop", w.child, Grant::default(), Some(out_w))
        .unwrap();
    let m = mnt.path().display();
    let script = format!(
        r#"echo a > {m}/{CHILD_DIR}/private/x && cat {m}/{CHILD_DIR}/private/x > /dev/null && echo ready
        for i in $(seq 1 1000); do [ -e {f} ] && break; sleep 0.01; done
        cat {m}/{CHILD_DIR}/private/x 2>&1 >/dev/null | sed 's/.*: //'
        touch {m}/{CHILD_DIR}/private/new 2>&1 | sed 's/.*: //'
        exit 0"#,
        f = flag.display()
    );
    let mut child = Reap(spawn_attach(&ticket, mnt.path(), &script));
    let mut stdout = child.0.stdout.take().unwrap();
    // Over the connection while it lasts (notes R16).
    let mut over = std::io::BufReader::new(std::fs::File::from(out_r));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut over, &mut line).unwrap();
    assert_eq!(line, "ready\n");
    // The run is over for the daemon: its connection is cut; what COMMAND writes from then on
    // goes to attach's own stdout.
    l.keys().revoke("run-drop", Duration::ZERO);
    std::fs::write(&flag, b"").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let status = child.0.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.0.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(
        rest.lines().collect::<Vec<_>>(),
        [
            "Transport endpoint is not connected",
            "Transport endpoint is not connected"
        ],
        "{stderr}"
    );
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("the mount failed closed"),
        "stderr: {stderr:?} rest: {rest:?}"
    );
    assert!(!w.store(&format!("{CHILD_DIR}/private/new")).exists());
}

/// The test user `smithfs-test`'s uid and gid (created, a system user without a home, when
/// missing).
fn test_user() -> (u32, u32) {
    let id = |flag: &str| {
        std::process::Command::new("id")
            .arg(flag)
            .arg("smithfs-test")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .trim()
                    .parse::<u32>()
                    .ok()
            })
    };
    if id("-u").is_none() {
        let made = std::process::Command::new("useradd")
            .args(["--system", "--no-create-home", "--home-dir", "/nonexistent"])
            .args(["--shell", "/usr/sbin/nologin", "smithfs-test"])
            .status()
            .unwrap();
        assert!(made.success(), "useradd smithfs-test");
    }
    (id("-u").unwrap(), id("-g").unwrap())
}

/// docs/PROTOCOL-NOTES.md R32: an `attach` that is not root, for a run whose uid (as the
/// daemon numbers it: 65534 here) is not its own (the test user's), mounts in a user namespace
/// where it *is* the run's uid: the run, in the §12 sandbox of the plan the welcome carries, is
/// that uid inside (its namespace maps it to itself, never to 0), the owners the daemon reports
/// for the smith's files are its own, so the node kernel lets it create in its `private/`, what
/// it creates is the run's uid in the daemon's store, and its result completes.
#[test]
fn a_non_root_attach_is_the_runs_uid_in_its_own_user_namespace() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !root() {
        eprintln!("skipped: creates the test user (root)");
        return;
    }
    let fuse = std::fs::metadata("/dev/fuse").map(|m| m.permissions().mode() & 0o006);
    if fuse.ok() != Some(0o006) {
        eprintln!(
            "skipped: /dev/fuse is not open to other users here (a non-root attach needs it)"
        );
        return;
    }
    let (uid, gid) = test_user();
    const RUN: u32 = 65534;
    let w = World::new();
    let mnt = tempfile::tempdir().unwrap();
    std::fs::set_permissions(mnt.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // The smith's dir is the run's uid's in the store, as the daemon's tree makes it (XT3).
    let chown = std::process::Command::new("chown")
        .args(["-R", &format!("{RUN}:{RUN}")])
        .arg(w.store(CHILD_DIR))
        .status()
        .unwrap();
    assert!(chown.success());
    let l = listener_at(&w, mnt.path());
    let mut plan =
        smithfs::sandbox::view::Plan::for_mount(&smithfs::config::Config::default(), mnt.path());
    plan.uid = RUN;
    plan.gid = RUN;
    plan.user = "agent".into();
    let smith_dir = mnt.path().join(CHILD_DIR);
    plan.cwd = Some(smith_dir.clone());
    let grant = smithfs::remote::keys::Grant {
        ids: Some((RUN, RUN)),
        sandbox: Some(serde_json::to_string(&plan).unwrap()),
    };
    let (out_r, out_w) = nix::unistd::pipe().unwrap();
    let ticket = l
        .ticket_with("run-userns", w.child, grant, Some(out_w))
        .unwrap();
    let output = read_all(out_r);
    let script = "id -u; cat /proc/self/uid_map; echo made > private/made.txt; \
                  stat -c %u private/made.txt; echo 7 > outbox/result.md; echo done";
    let mut child = Reap(spawn_attach_as(
        Some((uid, gid)),
        &ticket,
        &smith_dir,
        script,
    ));
    let (status, own, stderr) = finish(&mut child);
    // COMMAND's output came over the connection (notes R16).
    l.keys().revoke("run-userns", T);
    let stdout = output.join().unwrap();
    assert!(status.success(), "{own}\n{stdout}\n{stderr}");
    let lines: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let run = RUN.to_string();
    assert_eq!(
        lines,
        [
            vec![run.as_str()],
            vec![run.as_str(), run.as_str(), "1"],
            vec![run.as_str()],
            vec!["done"],
        ],
        "{stderr}"
    );
    let made = std::fs::metadata(w.store(&format!("{CHILD_DIR}/private/made.txt"))).unwrap();
    assert_eq!((made.uid(), made.gid()), (RUN, RUN));
    assert_eq!(
        std::fs::read(w.store(&format!("{CHILD_DIR}/outbox/result.md"))).unwrap(),
        b"7\n"
    );
    let t = w.take_triggers();
    assert!(
        t.iter()
            .any(|t| matches!(t, Trigger::ResultPublished { smith } if *smith == w.child)),
        "{t:?}"
    );
}

/// A node keeps what a connection told it as long as the daemon's own kernel does
/// (`REMOTE_TTL_SECS` = `TTL_SECS`, a day; docs/SPEC.md §13, notes R40): the entry and
/// attribute validity of LOOKUP, CREATE and GETATTR replies. Every change reaches the node as
/// it happens (pushed: tests/e2e/kernel_cache.rs `a_local_change_reaches_a_remote_mounts_cache_at_once`);
/// until 2026-12-05 a node kept them for 1 s because changes through the daemon's own mount were
/// not pushed.
#[test]
fn a_node_caches_entries_and_attributes_as_long_as_the_daemons_kernel() {
    use smithfs::fuse::dispatch::{ttl_secs, REMOTE_TTL_SECS};
    let day = ttl_secs(smithfs::fs::Cache::Normal);
    assert_eq!(REMOTE_TTL_SECS, day);
    let w = World::new();
    let l = listener(&w);
    let mut n = Node::new(&l.ticket("run-1", w.child).unwrap());
    let valid = |body: &[u8], at: usize| (u64_at(body, at), u64_at(body, at + 8));
    // fuse_entry_out: nodeid, generation, entry_valid, attr_valid.
    let (e, body) = n.call(LOOKUP, 1, &[], &cstr("smiths"));
    assert_eq!(e, 0);
    assert_eq!(
        valid(&body, 16),
        (day, day),
        "LOOKUP: entry_valid, attr_valid"
    );
    let private = n.walk(&format!("{CHILD_DIR}/private"));
    let mut arg = Vec::new();
    for v in [(libc::O_WRONLY | libc::O_CREAT) as u32, 0o644, 0o022, 0] {
        arg.extend_from_slice(&v.to_ne_bytes());
    }
    let (e, body) = n.call(CREATE, private, &arg, &cstr("f"));
    assert_eq!(e, 0);
    assert_eq!(
        valid(&body, 16),
        (day, day),
        "CREATE: entry_valid, attr_valid"
    );
    // fuse_attr_out: attr_valid first.
    let (e, body) = n.call(GETATTR, private, &[0u8; 16], &[]);
    assert_eq!(e, 0);
    assert_eq!(u64_at(&body, 0), day, "GETATTR: attr_valid");
}

/// Requests sent without waiting are served concurrently (notes R41), and the connection's
/// lookup counts stay exact: N pipelined LOOKUPs of one name are N lookups held, whatever order
/// they were served in.
#[test]
fn pipelined_requests_are_all_answered_and_counted() {
    let w = World::new();
    let l = listener(&w);
    let mut n = Node::new(&l.ticket("run-1", w.child).unwrap());
    let smith = n.walk(CHILD_DIR);
    const N: u64 = 200;
    let mut wanted = std::collections::HashSet::new();
    for _ in 0..N {
        let f = n.frame(LOOKUP, smith, &[], &cstr("private"));
        wanted.insert(n.unique);
        n.ch.send(&f).unwrap();
    }
    n.ch.flush_all(T).unwrap();
    let mut node = None;
    while !wanted.is_empty() {
        let (error, unique, body) = n.read_frame().expect("a reply");
        if unique == 0 {
            continue;
        }
        assert!(
            wanted.remove(&unique),
            "one reply to each request: {unique}"
        );
        assert_eq!(error, 0);
        let id = u64_at(&body, 0);
        assert_eq!(*node.get_or_insert(id), id);
    }
    let node = node.unwrap();
    // All but one given back: still held; the last one: no longer the connection's.
    let f = n.frame(FORGET, node, &(N - 1).to_ne_bytes(), &[]);
    n.ch.send(&f).unwrap();
    assert_eq!(
        n.getattr(node),
        0,
        "{N} lookups were counted, {} given back",
        N - 1
    );
    let f = n.frame(FORGET, node, &1u64.to_ne_bytes(), &[]);
    n.ch.send(&f).unwrap();
    assert_eq!(n.getattr(node), -libc::ESTALE);
}

/// A node that sends requests and never reads the replies (notes R7): the daemon stops reading
/// once its serving threads wait to send (the flood stays in the socket buffers, not in the
/// daemon's memory), another connection is served meanwhile, and every reply comes once the
/// node reads.
#[test]
fn a_node_that_floods_without_reading_is_held_to_its_socket_buffers() {
    let w = World::new();
    let l = listener(&w);
    let mut n = Node::new(&l.ticket("run-flood", w.child).unwrap());
    let mut sent = 0usize;
    let mut frames = 0u64;
    'flood: loop {
        let f = n.frame(GETATTR, 1, &[0u8; 16], &[]);
        n.ch.send(&f).unwrap();
        sent += f.len();
        frames += 1;
        assert!(
            sent < 1 << 30,
            "the daemon read {sent} bytes of requests without its replies being read"
        );
        if n.ch.flush().unwrap() {
            continue;
        }
        // The daemon reads on only while it has room: a second without progress is the bound.
        let stalled = Instant::now() + Duration::from_secs(1);
        while Instant::now() < stalled {
            n.ch.wait(false, None, Some(Duration::from_millis(50)))
                .unwrap();
            if n.ch.flush().unwrap() {
                continue 'flood;
            }
        }
        break;
    }
    // What the daemon buffers (4 MiB of requests, a reply per serving thread) and the socket
    // buffers both ways (requests one way, their replies the other), at most their sysctl
    // maxima each: far below what the loop would have offered.
    let most = |f: &str| {
        std::fs::read_to_string(f)
            .ok()
            .and_then(|t| t.split_whitespace().last()?.parse::<usize>().ok())
            .unwrap_or(8 << 20)
    };
    let buffers = most("/proc/sys/net/ipv4/tcp_rmem") + most("/proc/sys/net/ipv4/tcp_wmem");
    let bound = smithfs::remote::channel::FILL_LIMIT + 2 * buffers + (8 << 20);
    eprintln!("flood: {sent} bytes taken in (bound {bound})");
    assert!(sent < bound, "{sent} bytes taken in, more than {bound}");
    let mut other = Node::new(&l.ticket("run-other", w.child).unwrap());
    assert_eq!(
        other.getattr(1),
        0,
        "another connection is served meanwhile"
    );
    let mut answered = 0u64;
    while answered < frames {
        n.ch.flush().unwrap();
        let (error, unique, _) = n.read_frame().expect("every reply, once read");
        if unique != 0 {
            assert_eq!(error, 0);
            answered += 1;
        }
    }
}

/// Connections without a ticket cannot keep a run out (notes R50): 300 idle TCP connections to
/// the listener (a smith's flood found by a hostile-agent review closed every `attach` at accept
/// once 256 were open) — a run's connection made while they are still open is accepted and
/// served, and so is another after them; the idle ones beyond `MAX_UNPROVEN` were closed.
#[test]
fn connections_without_a_hello_cannot_keep_a_run_out() {
    let w = World::new();
    let l = listener(&w);
    let idle: Vec<std::net::TcpStream> = (0..300)
        .map(|_| std::net::TcpStream::connect(l.addr()).expect("connect"))
        .collect();
    let mut n = Node::new(&l.ticket("run-1", w.child).unwrap());
    assert!(
        n.lookup(1, "smiths").is_ok(),
        "the run's connection is served"
    );
    let mut again = Node::new(&l.ticket("run-2", w.child).unwrap());
    assert!(again.lookup(1, "smiths").is_ok());
    // The oldest idle ones were closed to make room: a read on them ends (EOF or reset).
    let mut first = &idle[0];
    first
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut b = [0u8; 1];
    let r = std::io::Read::read(&mut first, &mut b);
    assert!(
        matches!(r, Ok(0))
            || r.as_ref()
                .is_err_and(|e| e.kind() != std::io::ErrorKind::WouldBlock
                    && e.kind() != std::io::ErrorKind::TimedOut),
        "the oldest idle connection is still open: {r:?}"
    );
}

/// A ticket used by a run that has ended, replayed (its hello sent again, word for word), is
/// refused: the secret was spent by the first connection and revoked with the run; and the
/// listener goes on serving a live run.
#[test]
fn a_used_ticket_replayed_after_its_run_ended_is_refused() {
    let w = World::new();
    let l = listener(&w);
    let used = l.ticket("run-1", w.child).unwrap();
    let mut n = Node::new(&used);
    assert!(n.lookup(1, "smiths").is_ok());
    drop(n);
    l.keys().revoke("run-1", Duration::ZERO);
    for _ in 0..3 {
        assert!(
            matches!(attach(&used), Err(AttachError::Refused(_))),
            "a replayed ticket of an ended run was accepted"
        );
    }
    let mut live = Node::new(&l.ticket("run-2", w.child).unwrap());
    assert!(live.lookup(1, "smiths").is_ok());
}

/// xorshift64*: the fuzz test's deterministic bytes (its seed printed on failure).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// The listener fuzzed after valid hellos (docs/SPEC.md §13: "a malformed frame closes the
/// connection"): 60 connections each send one of random bytes, a frame with a valid length and
/// a random opcode, node id and arguments, or a valid frame cut short — then, for the
/// well-framed ones, a GETATTR. Each connection answers or is closed, never hangs; the
/// listener stays up; and a bystander connection opened before them, holding a file open,
/// still writes, reads and releases through its own handle afterwards, its node ids intact.
#[test]
fn random_frames_after_a_valid_hello_close_only_their_connection() {
    let w = World::new();
    let l = listener(&w);
    let mut by = Node::new(&l.ticket("run-by", w.child).unwrap());
    let private = by.walk(&format!("{CHILD_DIR}/private"));
    let (file, fh) = by.create(private, "bystander").unwrap();
    assert_eq!(by.write(file, fh, b"before"), 0);
    let seed = 0x5eed_0000_0000_0028u64;
    let mut rng = Rng(seed);
    for i in 0..60u32 {
        let mut n = Node::new(&l.ticket(&format!("run-f{i}"), w.child).unwrap());
        assert!(n.lookup(1, "smiths").is_ok());
        match rng.below(3) {
            0 => {
                // Random bytes: their first word is read as a length, then the stream ends.
                let len = 1 + rng.below(300) as usize;
                let junk = rng.bytes(len);
                let _ = n.ch.send(&junk);
                let _ = n.ch.flush_all(T);
                n.ch.close();
            }
            1 => {
                // A well-framed request with anything in it, then a GETATTR: the connection
                // answers that (it lived) or closes (the frame was malformed); it never hangs.
                let opcode = rng.below(64) as u32;
                let nodeid = match rng.below(3) {
                    0 => 1,
                    1 => file,
                    _ => rng.next(),
                };
                let arg_len = rng.below(120) as usize;
                let arg = rng.bytes(arg_len);
                let f = n.frame(opcode, nodeid, &arg, &[]);
                let probe = n.frame(GETATTR, 1, &[0u8; 16], &[]);
                let want = n.unique;
                let sent = n.ch.send(&f).and_then(|()| n.ch.send(&probe));
                if sent.is_ok() && n.ch.flush_all(T).is_ok() {
                    loop {
                        match n.read_frame() {
                            Ok((_, unique, _)) if unique == want => break,
                            Ok(_) => {}
                            Err(e) => {
                                assert_ne!(
                                    e.kind(),
                                    std::io::ErrorKind::TimedOut,
                                    "seed {seed:#x}, connection {i}: opcode {opcode} hung the connection"
                                );
                                break;
                            }
                        }
                    }
                }
            }
            _ => {
                // A valid WRITE frame cut short by the end of the stream.
                let data = rng.bytes(64);
                let mut f = n.frame(WRITE, file, &[0u8; 40], &data);
                let cut = 1 + rng.below(f.len() as u64 - 1) as usize;
                f.truncate(cut);
                let _ = n.ch.send(&f);
                let _ = n.ch.flush_all(T);
                n.ch.close();
            }
        }
        drop(n);
    }
    // The listener serves: a new run, and the bystander with what it held.
    let mut fresh = Node::new(&l.ticket("run-fresh", w.child).unwrap());
    assert!(fresh.lookup(1, "smiths").is_ok());
    drop(fresh);
    assert_eq!(
        by.getattr(file),
        0,
        "seed {seed:#x}: the bystander's node id"
    );
    assert_eq!(by.write(file, fh, b"after"), 0, "seed {seed:#x}");
    assert_eq!(by.release(file, fh), 0, "seed {seed:#x}");
    let fh = by.open(file, libc::O_RDONLY).unwrap();
    assert_eq!(by.read(file, fh).unwrap(), b"aftere", "seed {seed:#x}");
    eventually("only the bystander is left", || l.peers().len() == 1);
}

/// Finding 07 of the hostile review (docs/PROTOCOL-NOTES.md R51): a node makes a FIFO (and a
/// socket) in its own `private/`, then sends what no kernel sends for one — CREATE of the same
/// name without `O_EXCL`, OPEN of its node, a truncate — each of which opened the FIFO and
/// blocked a daemon thread for ever. Each is refused at once (ENXIO, EINVAL), the connection
/// goes on serving, and once it drops everything it held is given back.
#[test]
fn a_node_cannot_pin_a_daemon_thread_on_a_fifo() {
    const SETATTR: u32 = 4;
    const MKNOD: u32 = 8;
    let w = World::new();
    let l = listener(&w);
    let base = w.fs.counts();
    let mut n = Node::new(&l.ticket("run-fifo", w.child).unwrap());
    let private = n.walk(&format!("{CHILD_DIR}/private"));
    let mknod = |n: &mut Node, name: &str, kind: u32| {
        let mut arg = Vec::new();
        for v in [kind | 0o666, 0, 0o022, 0] {
            arg.extend_from_slice(&v.to_ne_bytes());
        }
        let (e, body) = n.call(MKNOD, private, &arg, &cstr(name));
        assert_eq!(e, 0, "mknod {name}");
        u64_at(&body, 0)
    };
    let fifo = mknod(&mut n, "fifo", libc::S_IFIFO);
    let sock = mknod(&mut n, "sock", libc::S_IFSOCK);
    let started = Instant::now();
    // Every flag combination a hostile node might try: none opens the FIFO.
    for _ in 0..4 {
        assert_eq!(
            n.create(private, "fifo"),
            Err(libc::ENXIO),
            "CREATE of a FIFO"
        );
        assert_eq!(
            n.create(private, "sock"),
            Err(libc::ENXIO),
            "CREATE of a socket"
        );
    }
    for flags in [
        libc::O_RDONLY,
        libc::O_WRONLY,
        libc::O_RDWR,
        libc::O_WRONLY | libc::O_TRUNC,
    ] {
        assert_eq!(
            n.open(fifo, flags),
            Err(libc::ENXIO),
            "OPEN of a FIFO ({flags:#o})"
        );
        assert_eq!(
            n.open(sock, flags),
            Err(libc::ENXIO),
            "OPEN of a socket ({flags:#o})"
        );
    }
    let mut setattr = vec![0u8; 88];
    setattr[0..4].copy_from_slice(&(1u32 << 3).to_ne_bytes()); // FATTR_SIZE
    assert_eq!(
        n.call(SETATTR, fifo, &setattr, &[]).0,
        -libc::EINVAL,
        "truncate of a FIFO"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused at once, not after a partner came: {:?}",
        started.elapsed()
    );
    // The connection still serves, and a regular file is still created and opened.
    let (file, fh) = n.create(private, "plain").unwrap();
    assert_eq!(n.write(file, fh, b"x"), 0);
    assert_eq!(n.release(file, fh), 0);
    let fh = n.open(file, libc::O_RDONLY).unwrap();
    assert_eq!(n.read(file, fh).unwrap(), b"x");
    drop(n);
    eventually(
        "the connection's lookups and handles are given back",
        || w.fs.counts() == base,
    );
}

/// Flood `port` on 127.0.0.1 from `source` with silent connections (non-blocking connects, the
/// last 600 kept open, as finding 02's `flood2.py`) until `stop`; returns how many were made.
fn flood(
    port: u16,
    source: std::net::Ipv4Addr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let addr = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    std::thread::spawn(move || {
        let from = addr(source, 0);
        let to = addr(std::net::Ipv4Addr::LOCALHOST, port);
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let mut open = std::collections::VecDeque::new();
        let mut n = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            // SAFETY: plain socket calls on a descriptor this loop owns, with valid addresses
            // of the length passed.
            let fd = unsafe {
                libc::socket(
                    libc::AF_INET,
                    libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                    0,
                )
            };
            if fd < 0 {
                continue;
            }
            // SAFETY: `fd` was just made and is owned from here on.
            let s = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: as above.
            let bound = unsafe {
                libc::bind(
                    s.as_raw_fd(),
                    (&from as *const libc::sockaddr_in).cast(),
                    len,
                )
            };
            if bound != 0 {
                continue;
            }
            // SAFETY: as above.
            let r = unsafe {
                libc::connect(s.as_raw_fd(), (&to as *const libc::sockaddr_in).cast(), len)
            };
            if r != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINPROGRESS) {
                continue;
            }
            n += 1;
            open.push_back(s);
            if open.len() > 600 {
                open.pop_front();
            }
        }
        n
    })
}

/// Finding 02 of the hostile review (docs/PROTOCOL-NOTES.md R50): a flood of silent
/// connections (two threads of non-blocking connects) from another address (127.0.0.2), then
/// from the runs' own (127.0.0.1), while ten runs attach one after the other with
/// `attach_retrying` (what `smithfs attach` does): every run gets in and is served; the retries
/// it took are printed (a new connection beyond the 32 unproven closes one of the address
/// holding the most, a silent one first, so they are rare; a connection closed before its
/// welcome did not spend the ticket).
#[test]
fn a_connect_flood_cannot_keep_runs_out() {
    use smithfs::remote::client::{attach_retrying, RETRY_WITHIN};
    let w = World::new();
    let l = listener(&w);
    let port = l.addr().port();
    for source in [
        std::net::Ipv4Addr::new(127, 0, 0, 2),
        std::net::Ipv4Addr::LOCALHOST,
    ] {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let floods: Vec<_> = (0..2).map(|_| flood(port, source, stop.clone())).collect();
        // Let the flood fill the unproven connections first.
        std::thread::sleep(Duration::from_millis(300));
        let started = Instant::now();
        let mut retries = 0;
        for i in 0..10 {
            let t = l.ticket(&format!("run-{source}-{i}"), w.child).unwrap();
            let a = attach_retrying(&t, RETRY_WITHIN, |_, _| retries += 1)
                .unwrap_or_else(|e| panic!("run {i} flooded from {source}: {e}"));
            let mut n = Node {
                ch: a.channel,
                unique: 1,
                notes: Vec::new(),
            };
            assert!(n.lookup(1, "smiths").is_ok(), "run {i} is served");
        }
        let took = started.elapsed();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let made: u64 = floods.into_iter().map(|f| f.join().unwrap()).sum();
        eprintln!("flood from {source}: {made} connects; 10 runs in {took:?}, {retries} retries");
        assert!(made > 1000, "the flood flooded ({made} connects)");
    }
}

/// Finding 03 of the hostile review (docs/PROTOCOL-NOTES.md R62): a name made in a smith's
/// `private/` is pushed only to connections that hold that directory. The root smith's run
/// (which may not list the child's `private/`, and never looked it up) holds the child's
/// directory and the root: after the child's run creates, renames and removes names in its
/// `private/`, the root's connection was told none of them, while a connection of the child
/// that holds `private/` was told each.
#[test]
fn a_name_is_pushed_only_to_connections_that_hold_its_directory() {
    let w = World::new();
    let l = listener(&w);
    let root = w.fs.registry().by_full_id("smith-root").unwrap();
    let mut a = Node::new(&l.ticket("run-child", w.child).unwrap());
    let mut b = Node::new(&l.ticket("run-child-2", w.child).unwrap());
    let mut spy = Node::new(&l.ticket("run-root", root).unwrap());
    let private = a.walk(&format!("{CHILD_DIR}/private"));
    assert_eq!(b.walk(&format!("{CHILD_DIR}/private")), private);
    let child_dir = spy.walk(CHILD_DIR);
    let (file, fh) = a.create(private, "my-secret-name.txt").unwrap();
    assert_eq!(a.write(file, fh, b"x"), 0);
    assert_eq!(a.release(file, fh), 0);
    assert_eq!(spy.getattr(child_dir), 0);
    assert_eq!(b.getattr(private), 0);
    let names = |n: &Node| -> Vec<String> {
        n.notes
            .iter()
            .filter(|(code, _)| *code == 3)
            .map(|(_, body)| String::from_utf8_lossy(&body[16..]).into_owned())
            .collect()
    };
    assert!(
        names(&b)
            .iter()
            .any(|n| n.starts_with("my-secret-name.txt")),
        "the holder of private/ is told: {:?}",
        b.notes
    );
    assert!(
        !names(&spy).iter().any(|n| n.contains("secret")),
        "a name in a directory the connection does not hold was pushed to it: {:?}",
        names(&spy)
    );
}
