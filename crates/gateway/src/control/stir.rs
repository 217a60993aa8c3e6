//! `Stir`: wakes the control thread's quiet tick when one of its own tasks (a health
//! probe, a metrics scrape, a model listing) delivered a result to the plane, so what it
//! changed reaches the workers now rather than at the end of the quiet tick. (The task's
//! own completion has woken the thread already; the poke only lets the tick run in that
//! wake-up.)
//!
//! Owns a flag and a waker slot, both used on the control thread only.

use std::cell::Cell;
use std::task::{Poll, Waker};

/// A same-thread wake-up for the control thread's quiet tick.
#[derive(Default)]
pub struct Stir {
    poked: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl Stir {
    /// Says a result reached the plane: a quiet tick waiting on [`stirred`](Stir::stirred) ends.
    pub fn poke(&self) {
        self.poked.set(true);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    /// Resolves once [`poke`](Stir::poke) was called since the last time it resolved.
    pub async fn stirred(&self) {
        std::future::poll_fn(|cx| {
            if self.poked.replace(false) {
                return Poll::Ready(());
            }
            self.waker.set(Some(cx.waker().clone()));
            Poll::Pending
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn a_poke_from_another_task_ends_the_wait_once() {
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap();
        rt.block_on(async {
            let stir = Rc::new(Stir::default());
            let other = stir.clone();
            monoio::spawn(async move {
                monoio::time::sleep(std::time::Duration::from_millis(5)).await;
                other.poke();
            });
            stir.stirred().await;
            let mut again = std::pin::pin!(stir.stirred());
            let waker = Waker::noop();
            let pending = std::future::Future::poll(
                again.as_mut(),
                &mut std::task::Context::from_waker(waker),
            )
            .is_pending();
            assert!(pending, "one poke ends one wait");
        });
    }
}
