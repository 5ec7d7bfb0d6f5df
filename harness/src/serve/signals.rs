//! Shutdown on SIGINT, SIGTERM or SIGHUP, taken as `results/staging.rs` takes interrupts: the
//! signals are blocked in the thread that starts the server (every thread it starts inherits
//! the mask) and one thread takes them with `sigwait`, so no handler runs anywhere. The first
//! signal drains (new requests are answered 503, running ones finish, for at most the drain
//! timeout, then what is left is cancelled); a second one cancels at once.

use std::io;

/// The signals that stop the server: a run's interrupt signals.
fn stop_signals() -> libc::sigset_t {
    crate::results::staging::interrupt_signals()
}

/// Block the stop signals in the calling thread (and so in every thread it starts after).
pub fn block() -> io::Result<()> {
    let set = stop_signals();
    // SAFETY: `set` is initialised; the old mask is not wanted.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Take stop signals on a thread of their own; `on_signal(n)` is called with the count so far
/// (1 for the first). Call [`block`] first, from the thread that starts every other.
pub fn spawn(mut on_signal: impl FnMut(u32) + Send + 'static) -> io::Result<()> {
    let set = stop_signals();
    std::thread::Builder::new()
        .name("serve-signals".into())
        .spawn(move || {
            let mut n = 0;
            loop {
                let mut sig: libc::c_int = 0;
                // SAFETY: `set` is initialised and blocked in this thread (inherited); `sig` is
                // a valid out-pointer.
                if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                    n += 1;
                    on_signal(n);
                }
            }
        })?;
    Ok(())
}
