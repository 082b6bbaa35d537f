//! `results/final.md` copied off the scheduler thread (docs/SPEC.md §9, notes H20): the copy of
//! a large result, or the comparison that finds it unchanged, must never hold up every other
//! smith's scheduling. Requests coalesce (only the newest result matters) and a result whose
//! file is the one last copied (same inode, size, mtime and ctime, and `final.md` untouched
//! since) is not read again.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::sched::store_facts::{self, FinalCopied, Fingerprint};
use crate::sched::Msg;

/// What the copier thread and the scheduler share.
#[derive(Default)]
struct Slot {
    /// A copy was asked for since the thread last looked.
    requested: bool,
    /// End the thread once no copy is asked for.
    quit: bool,
    /// What the thread copied, not yet taken by the scheduler (merged: `results_made` is
    /// sticky).
    copied: Option<FinalCopied>,
}

/// The copier thread's handle: ask for a copy, take what was copied, stop.
pub(super) struct FinalCopier {
    shared: Arc<(Mutex<Slot>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl FinalCopier {
    /// Start the thread on the store's root `root`; it wakes the scheduler through `tx` (a
    /// [`Msg::FinalCopied`], never blocking: a full queue wakes the loop anyway).
    pub(super) fn start(root: OwnedFd, tx: SyncSender<Msg>) -> std::io::Result<FinalCopier> {
        let shared: Arc<(Mutex<Slot>, Condvar)> = Arc::default();
        let theirs = shared.clone();
        let thread = std::thread::Builder::new()
            .name("smithfs-final".into())
            .spawn(move || copier(&root, &theirs, &tx))?;
        Ok(FinalCopier {
            shared,
            thread: Some(thread),
        })
    }

    /// Ask for `results/final.md` to be brought up to date (coalesced with any request not
    /// yet served).
    pub(super) fn request(&self) {
        let (m, cv) = &*self.shared;
        m.lock().requested = true;
        cv.notify_one();
    }

    /// What was copied since the last call.
    pub(super) fn take(&self) -> Option<FinalCopied> {
        self.shared.0.lock().copied.take()
    }

    /// Serve the request still pending, then end the thread and wait for it (at the
    /// scheduler's end, so an unmount right after the root published still has its copy).
    pub(super) fn finish(&mut self) {
        {
            let (m, cv) = &*self.shared;
            m.lock().quit = true;
            cv.notify_one();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for FinalCopier {
    fn drop(&mut self) {
        self.finish();
    }
}

fn copier(root: &OwnedFd, shared: &(Mutex<Slot>, Condvar), tx: &SyncSender<Msg>) {
    let (m, cv) = shared;
    // The result and `final.md` as they were after the last copy (or the comparison that
    // found them equal): the same again means nothing to read.
    let mut last: Option<(Fingerprint, Fingerprint)> = None;
    loop {
        {
            let mut g = m.lock();
            while !g.requested && !g.quit {
                cv.wait(&mut g);
            }
            if !g.requested {
                return;
            }
            g.requested = false;
        }
        match store_facts::copy_final(root.as_fd(), &mut last) {
            Ok(Some(copied)) => {
                {
                    let mut g = m.lock();
                    let made = g.copied.is_some_and(|c| c.results_made);
                    g.copied = Some(FinalCopied {
                        results_made: made || copied.results_made,
                        ..copied
                    });
                }
                let _ = tx.try_send(Msg::FinalCopied);
            }
            Ok(None) => {}
            Err(e) => tracing::error!("cannot copy the root's result to results/final.md: {e}"),
        }
    }
}
