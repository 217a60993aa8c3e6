//! A core's configurations: the current one, which every new request uses, and the ones a
//! reload replaced, which live on until their last request ends.
//!
//! Owns the switch between configurations on one core. A request takes the current state
//! once its head is complete and keeps it to the end, so requests and streams already
//! running finish on the routes they started with, and idle keep-alive connections stay
//! open across a reload. It must not hold a replaced state alive itself: only requests do.

use std::cell::RefCell;
use std::rc::{Rc, Weak};

use super::state::{WorkerCore, WorkerState};

pub struct Generations {
    pub core: Rc<WorkerCore>,
    current: RefCell<Rc<WorkerState>>,
    /// Replaced states that may still serve requests; ticked until they are gone.
    retired: RefCell<Vec<Weak<WorkerState>>>,
}

impl Generations {
    pub fn new(first: WorkerState) -> Self {
        Generations {
            core: first.core.clone(),
            current: RefCell::new(Rc::new(first)),
            retired: RefCell::new(Vec::new()),
        }
    }

    /// The state new requests use.
    #[inline]
    pub fn current(&self) -> Rc<WorkerState> {
        self.current.borrow().clone()
    }

    /// Makes `next` the state of every request from now on.
    pub fn switch(&self, next: WorkerState) {
        let old = std::mem::replace(&mut *self.current.borrow_mut(), Rc::new(next));
        self.retired.borrow_mut().push(Rc::downgrade(&old));
    }

    /// The signal tick of the current state and of every replaced one still serving (so
    /// their records reach the control thread).
    pub fn signal_tick(&self) {
        self.current().signal_tick();
        let mut retired = self.retired.borrow_mut();
        retired.retain(|w| match w.upgrade() {
            Some(s) => {
                s.signal_tick();
                true
            }
            None => false,
        });
    }

    /// Replaced states still serving a request.
    pub fn retired(&self) -> usize {
        self.retired
            .borrow()
            .iter()
            .filter(|w| w.strong_count() > 0)
            .count()
    }
}
