//! Device memory: what a sort of `n` rows holds on the device at its peak
//! ([`device_bytes_needed`]), by which [`CudaBackend`](crate::CudaBackend) sizes an external
//! sort's runs and a [`GpuSortSession`](crate::GpuSortSession) decides whether its gathers may
//! be packed; and the [`DeviceBudget`] that every sort of the process reserves that memory
//! from, so that sorts running at once share the device instead of failing. No kernel: the
//! figures follow the buffers that `lsd.rs`, `msd` and `gather.rs` allocate (two per moved
//! column, the gathers' of [`gather_bytes_per_row`]).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::gather::gather_bytes_per_row;

/// Device bytes a sort of `n` rows holds at its peak: both buffers of the varying key words
/// (and, for a key of at most two, a word a row for the ranks of few distinct keys,
/// `presorted.rs`), and either both buffers of every moved column (direct) or the columns,
/// both buffers of the row index and what the gathers hold beyond the columns (indirect,
/// [`gather_bytes_per_row`]: the widest column, or with `pack` the widest packed group), plus
/// scratch.
pub(crate) fn device_bytes_needed(
    n: usize,
    key_words: usize,
    widths: &[usize],
    nullable: usize,
    direct: bool,
    pack: bool,
) -> usize {
    let ranks = if key_words <= 2 { 4 * n } else { 0 };
    let keys = 2 * key_words * 4 * n + ranks;
    let columns: usize = widths.iter().sum::<usize>() * n + nullable * n.div_ceil(8);
    let records = if direct {
        2 * columns + 2 * nullable.div_ceil(32) * 4 * n
    } else {
        columns + 2 * 4 * n + gather_bytes_per_row(widths, pack) * n
    };
    keys + records + (n / 256 + 1) * 1024 + (16 << 20)
}

/// The device memory of one GPU shared by every sort of the process: each sort reserves what
/// it holds on the device ([`DeviceReservation`]) before it allocates it — its uploaded
/// segments as they go up, then its whole footprint ([`device_bytes_needed`]) before the
/// device phase — so that sorts running at once never hold more than the budget together,
/// and none fails because another one holds the memory.
///
/// A reservation that does not fit **waits** while some other sort that holds memory is not
/// itself waiting (a sort in its device phase, or one still uploading: it will release its
/// memory without waiting for anyone); when every other holder waits too, nobody would ever
/// release, so it is **refused** ([`BudgetRefusal`]) and the caller sorts elsewhere (the CPU)
/// with the reason. A refused sort releases what it held, which lets the others go on. A
/// reservation larger than the budget is refused at once.
///
/// The budget is per device and per process ([`DeviceBudget::for_device`]): its capacity is
/// `GPUSORT_DEVICE_BUDGET` (a size: `40g`, `40GiB`, bytes) or, by default, the device's free
/// memory when the budget is first asked for, less [`DeviceBudget::reserve_of`] for the
/// allocator's slack and other users of the device.
#[derive(Debug)]
pub struct DeviceBudget {
    capacity: usize,
    state: Mutex<BudgetState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct BudgetState {
    reserved: usize,
    /// Live reservations.
    holders: usize,
    /// Reservations that hold memory and are not waiting: they will release it.
    active: usize,
    /// Reservations waiting now.
    waiting: usize,
    peak: usize,
    waits: u64,
    refusals: u64,
}

/// What a [`DeviceBudget`] holds and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceBudgetStats {
    /// Bytes all sorts together may hold.
    pub capacity: usize,
    /// Bytes reserved now.
    pub reserved: usize,
    /// Live reservations (sorts under way on the device or uploading to it).
    pub sorts: usize,
    /// Reservations waiting now for memory another sort holds.
    pub waiting: usize,
    /// Most bytes reserved at once.
    pub peak: usize,
    /// Reservations that had to wait.
    pub waits: u64,
    /// Reservations refused.
    pub refusals: u64,
}

/// Why a reservation was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetRefusal {
    /// Bytes the sort asked to hold in all.
    pub needed: usize,
    /// Bytes other sorts held.
    pub held_by_others: usize,
    /// The budget.
    pub capacity: usize,
    /// Other sorts holding memory.
    pub others: usize,
}

impl std::fmt::Display for BudgetRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.needed > self.capacity {
            write!(
                f,
                "the sort needs {} bytes of GPU memory, more than the process's device memory budget of {}",
                self.needed, self.capacity
            )
        } else {
            write!(
                f,
                "the sort needs {} bytes of GPU memory; {} other sorts of this process hold {} of the {}-byte \
                 device memory budget and all of them wait for memory too",
                self.needed, self.others, self.held_by_others, self.capacity
            )
        }
    }
}

impl DeviceBudget {
    /// A budget of `capacity` bytes.
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            capacity,
            state: Mutex::new(BudgetState::default()),
            changed: Condvar::new(),
        })
    }

    /// The process's budget for device `ordinal`, made on first use with the capacity
    /// `configured` (`GpuOptions::device_budget`), else `free` (the device's free memory, asked
    /// for only then) less [`Self::reserve_of`] it.
    pub fn for_device(ordinal: usize, configured: Option<usize>, free: impl FnOnce() -> usize) -> Arc<Self> {
        static BUDGETS: OnceLock<Mutex<HashMap<usize, Arc<DeviceBudget>>>> = OnceLock::new();
        let mut budgets = BUDGETS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        Arc::clone(budgets.entry(ordinal).or_insert_with(|| {
            Self::new(configured.unwrap_or_else(|| {
                let free = free();
                free - Self::reserve_of(free)
            }))
        }))
    }

    /// What the default budget leaves of `free` bytes: a sixteenth, at least 256 MiB (or all
    /// of a smaller device), for the stream-ordered pool's slack, the context and other users.
    pub fn reserve_of(free: usize) -> usize {
        (free / 16).max(256 << 20).min(free)
    }

    /// Bytes all sorts together may hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes one sort may hold: `limit` (a sort's own limit) within the capacity, and within
    /// `device_free` (the device's free memory now) plus what the process's sorts hold, which
    /// is less when another process uses the device.
    pub fn per_sort(&self, device_free: usize, limit: Option<usize>) -> usize {
        let usable = self.capacity.min(device_free.saturating_add(self.state().reserved));
        limit.map_or(usable, |l| l.min(usable))
    }

    fn state(&self) -> MutexGuard<'_, BudgetState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the budget holds and did.
    pub fn stats(&self) -> DeviceBudgetStats {
        let s = self.state();
        DeviceBudgetStats {
            capacity: self.capacity,
            reserved: s.reserved,
            sorts: s.holders,
            waiting: s.waiting,
            peak: s.peak,
            waits: s.waits,
            refusals: s.refusals,
        }
    }

    /// A reservation of nothing yet, for one sort.
    pub fn reservation(self: &Arc<Self>) -> DeviceReservation {
        self.state().holders += 1;
        DeviceReservation {
            budget: Arc::clone(self),
            bytes: 0,
        }
    }
}

/// The device memory one sort holds of a [`DeviceBudget`]; released when dropped.
#[derive(Debug)]
pub struct DeviceReservation {
    budget: Arc<DeviceBudget>,
    bytes: usize,
}

impl DeviceReservation {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The budget.
    pub fn budget(&self) -> &Arc<DeviceBudget> {
        &self.budget
    }

    /// Holds `total` bytes in all, waiting for memory other sorts hold (see [`DeviceBudget`]);
    /// returns how long it waited. On refusal it still holds what it held before.
    pub fn grow_to(&mut self, total: usize) -> Result<Duration, BudgetRefusal> {
        self.grow(total, true)
    }

    /// Holds `total` bytes in all when they are free now; false (holding what it held) else.
    pub fn try_grow_to(&mut self, total: usize) -> bool {
        self.grow(total, false).is_ok()
    }

    fn grow(&mut self, total: usize, wait: bool) -> Result<Duration, BudgetRefusal> {
        let budget = Arc::clone(&self.budget);
        let mut s = budget.state();
        if total <= self.bytes {
            return Ok(Duration::ZERO);
        }
        let started = Instant::now();
        let mut waited = false;
        loop {
            let others = s.reserved - self.bytes;
            if others + total <= budget.capacity {
                if self.bytes == 0 {
                    s.active += 1;
                }
                s.reserved += total - self.bytes;
                s.peak = s.peak.max(s.reserved);
                self.bytes = total;
                return Ok(if waited { started.elapsed() } else { Duration::ZERO });
            }
            let mine = usize::from(self.bytes > 0);
            // Others that will release memory without waiting for anyone.
            let releasing = s.active - mine;
            if !wait || total > budget.capacity || releasing == 0 {
                if wait {
                    s.refusals += 1;
                }
                return Err(BudgetRefusal {
                    needed: total,
                    held_by_others: others,
                    capacity: budget.capacity,
                    others: s.holders - 1,
                });
            }
            if !waited {
                s.waits += 1;
                waited = true;
            }
            s.active -= mine;
            s.waiting += 1;
            // A waiter that holds memory no longer counts as releasing it: the others re-check.
            if mine == 1 {
                budget.changed.notify_all();
            }
            s = budget.changed.wait(s).unwrap_or_else(|p| p.into_inner());
            s.waiting -= 1;
            s.active += mine;
        }
    }

    /// Holds what `other` (of the same budget) holds too: one holder of both's bytes, as when
    /// a sort takes over memory reserved for its input. `other` is given back when it is of
    /// another budget.
    pub fn merge(&mut self, mut other: DeviceReservation) -> Result<(), DeviceReservation> {
        if !Arc::ptr_eq(&self.budget, &other.budget) {
            return Err(other);
        }
        if other.bytes > 0 {
            let mut s = self.budget.state();
            // Two active holders become one.
            if self.bytes > 0 {
                s.active -= 1;
            }
            self.bytes += other.bytes;
            other.bytes = 0;
        }
        Ok(())
    }

    /// Holds at most `total` bytes from now on.
    pub fn shrink_to(&mut self, total: usize) {
        if total >= self.bytes {
            return;
        }
        let mut s = self.budget.state();
        s.reserved -= self.bytes - total;
        if total == 0 {
            s.active -= 1;
        }
        self.bytes = total;
        drop(s);
        self.budget.changed.notify_all();
    }
}

impl Drop for DeviceReservation {
    fn drop(&mut self) {
        self.shrink_to(0);
        self.budget.state().holders -= 1;
        self.budget.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Waits until `budget` has `n` waiters.
    fn until_waiting(budget: &DeviceBudget, n: usize) {
        let start = Instant::now();
        while budget.stats().waiting < n {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no waiter: {:?}",
                budget.stats()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn reservations_add_up_to_the_capacity_and_return_on_drop() {
        let budget = DeviceBudget::new(100);
        let mut a = budget.reservation();
        let mut b = budget.reservation();
        assert_eq!(a.grow_to(40), Ok(Duration::ZERO));
        assert!(b.try_grow_to(60));
        assert!(!b.try_grow_to(61), "over the capacity");
        assert_eq!(b.bytes(), 60, "a refusal keeps what was held");
        a.shrink_to(10);
        assert!(b.try_grow_to(90));
        let s = budget.stats();
        assert_eq!((s.reserved, s.sorts, s.peak, s.refusals), (100, 2, 100, 0));
        drop((a, b));
        let s = budget.stats();
        assert_eq!((s.reserved, s.sorts, s.waiting), (0, 0, 0));
    }

    #[test]
    fn merged_reservations_are_one_holder_of_both() {
        let budget = DeviceBudget::new(100);
        let mut a = budget.reservation();
        let mut b = budget.reservation();
        let mut empty = budget.reservation();
        assert!(a.try_grow_to(40) && b.try_grow_to(30));
        assert_eq!(budget.stats().sorts, 3);
        a.merge(b).unwrap();
        assert_eq!((a.bytes(), budget.stats().reserved, budget.stats().sorts), (70, 70, 2));
        // What it merged is no other holder to wait for.
        assert_eq!(a.grow_to(100), Ok(Duration::ZERO));
        empty.merge(a).unwrap();
        assert_eq!((empty.bytes(), budget.stats().sorts), (100, 1));
        let other = DeviceBudget::new(100);
        let mut c = other.reservation();
        assert!(c.try_grow_to(5));
        let c = empty.merge(c).unwrap_err();
        assert_eq!((c.bytes(), empty.bytes()), (5, 100));
        drop(empty);
        let s = budget.stats();
        assert_eq!((s.reserved, s.sorts, s.waiting), (0, 0, 0));
    }

    #[test]
    fn more_than_the_capacity_is_refused_at_once() {
        let budget = DeviceBudget::new(100);
        let mut a = budget.reservation();
        let e = a.grow_to(101).unwrap_err();
        assert_eq!((e.needed, e.capacity, e.held_by_others), (101, 100, 0));
        assert!(
            e.to_string().contains("more than the process's device memory budget"),
            "{e}"
        );
        assert_eq!(budget.stats().refusals, 1);
    }

    #[test]
    fn a_sort_waits_for_memory_another_sort_will_release() {
        let budget = DeviceBudget::new(100);
        let mut holder = budget.reservation();
        holder.grow_to(70).unwrap();
        let waiter = {
            let budget = Arc::clone(&budget);
            std::thread::spawn(move || {
                let mut r = budget.reservation();
                let waited = r.grow_to(60).unwrap();
                (waited, r.bytes())
            })
        };
        until_waiting(&budget, 1);
        std::thread::sleep(Duration::from_millis(20));
        drop(holder);
        let (waited, bytes) = waiter.join().unwrap();
        assert!(waited >= Duration::from_millis(20), "{waited:?}");
        assert_eq!(bytes, 60);
        let s = budget.stats();
        assert_eq!((s.reserved, s.sorts, s.waits, s.refusals), (0, 0, 1, 0));
    }

    #[test]
    fn sorts_that_would_wait_for_each_other_do_not_deadlock() {
        // Both hold uploads and need more than is left: the second to ask is refused, and
        // once it releases its uploads the first goes on.
        let budget = DeviceBudget::new(70);
        let mut first = budget.reservation();
        let mut second = budget.reservation();
        first.grow_to(30).unwrap();
        second.grow_to(30).unwrap();
        let first = std::thread::spawn(move || {
            first.grow_to(60).unwrap();
            first.bytes()
        });
        until_waiting(&budget, 1);
        let e = second.grow_to(60).unwrap_err();
        assert_eq!((e.needed, e.held_by_others, e.others), (60, 30, 1));
        assert!(e.to_string().contains("wait for memory too"), "{e}");
        assert_eq!(second.bytes(), 30);
        drop(second);
        assert_eq!(first.join().unwrap(), 60);
        let s = budget.stats();
        assert_eq!((s.reserved, s.sorts, s.refusals), (0, 0, 1));
    }

    #[test]
    fn a_sort_holding_nothing_waits_for_a_holder_and_is_refused_when_every_holder_waits() {
        let budget = DeviceBudget::new(50);
        let (mut a, mut c) = (budget.reservation(), budget.reservation());
        a.grow_to(40).unwrap();
        c.grow_to(5).unwrap();
        // `a` waits for `c`; `c`, growing, would wait for `a` alone: refused.
        let a = std::thread::spawn(move || a.grow_to(48).map(|_| a));
        until_waiting(&budget, 1);
        assert!(c.grow_to(15).is_err());
        // A sort holding nothing waits while `c` (refused, not waiting) still holds memory...
        let b = {
            let budget = Arc::clone(&budget);
            std::thread::spawn(move || budget.reservation().grow_to(10).map(|_| ()))
        };
        until_waiting(&budget, 2);
        // ... and once `c` releases it, `a` goes on, and `b` fits beside it.
        drop(c);
        let a = a.join().unwrap().unwrap();
        assert_eq!(a.bytes(), 48);
        drop(a);
        b.join().unwrap().unwrap();
        assert_eq!(budget.stats().reserved, 0);
    }

    /// 16 sorts at once, 200 each: uploads in four steps, then the whole footprint, held a
    /// moment, released; a refused sort drops what it holds (it sorts on the CPU). Returns the
    /// sorts done and refused; checks that the budget is never passed and ends empty.
    fn many_sorts(capacity: usize, need: impl Fn(usize, usize) -> usize + Send + Sync + 'static) -> (usize, usize) {
        let budget = DeviceBudget::new(capacity);
        let need = Arc::new(need);
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = {
            let (budget, stop) = (Arc::clone(&budget), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    assert!(budget.stats().reserved <= capacity);
                    std::thread::yield_now();
                }
            })
        };
        let sorts: Vec<_> = (0..16)
            .map(|t| {
                let (budget, need) = (Arc::clone(&budget), Arc::clone(&need));
                std::thread::spawn(move || {
                    let (mut done, mut refused) = (0, 0);
                    for i in 0..200 {
                        let need = need(t, i);
                        let mut r = budget.reservation();
                        if (1..=4).all(|step| r.grow_to(need * step / 8).is_ok()) && r.grow_to(need).is_ok() {
                            done += 1;
                            std::thread::yield_now();
                        } else {
                            refused += 1;
                        }
                    }
                    (done, refused)
                })
            })
            .collect();
        let (mut done, mut refused) = (0, 0);
        for s in sorts {
            let (d, r) = s.join().unwrap();
            done += d;
            refused += r;
        }
        stop.store(true, Ordering::Relaxed);
        watcher.join().unwrap();
        let s = budget.stats();
        assert_eq!((s.reserved, s.sorts, s.waiting), (0, 0, 0), "{s:?}");
        assert!(s.peak <= capacity);
        assert_eq!(done + refused, 16 * 200);
        assert_eq!(s.refusals as usize, refused);
        (done, refused)
    }

    #[test]
    fn sorts_that_fit_together_never_wait_nor_are_refused() {
        let (done, refused) = many_sorts(16 * 450, |t, i| 50 + (t * 37 + i * 11) % 400);
        assert_eq!((done, refused), (3200, 0));
    }

    #[test]
    fn oversubscribed_sorts_never_pass_the_budget_and_all_end() {
        // Four times the budget asked for at once: sorts wait, some are refused, none hangs.
        let (done, _) = many_sorts(1000, |t, i| 50 + (t * 37 + i * 11) % 400);
        assert!(done > 0);
    }
}
