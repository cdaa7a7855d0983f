//! A value tasks wait on, waking them in the order they began to wait.
//!
//! tokio's `watch` would do the job, but it spreads its receivers over
//! eight `Notify`s picked at random per runtime (`BigNotify` in
//! `tokio::sync::watch`), so the tasks one change wakes run in a different
//! order on every run, and a seed would not replay. `Notify::notify_waiters`
//! wakes waiters in the order they came.

use std::sync::Mutex;

use tokio::sync::Notify;

#[derive(Default)]
pub(super) struct Signal<T> {
    value: Mutex<T>,
    changed: Notify,
}

impl<T: Clone> Signal<T> {
    pub(super) fn new(value: T) -> Self {
        Signal {
            value: Mutex::new(value),
            changed: Notify::new(),
        }
    }

    pub(super) fn get(&self) -> T {
        self.value.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Changes the value and wakes every waiter.
    pub(super) fn modify(&self, change: impl FnOnce(&mut T)) {
        change(&mut self.value.lock().unwrap_or_else(|e| e.into_inner()));
        self.changed.notify_waiters();
    }

    pub(super) fn set(&self, value: T) {
        self.modify(|v| *v = value);
    }

    /// The value, once `ready` holds for it.
    pub(super) async fn wait_for(&self, ready: impl Fn(&T) -> bool) -> T {
        loop {
            let changed = self.changed.notified();
            let mut changed = std::pin::pin!(changed);
            // Registered before the look, so a change in between still wakes us.
            changed.as_mut().enable();
            let value = self.get();
            if ready(&value) {
                return value;
            }
            changed.await;
        }
    }
}
