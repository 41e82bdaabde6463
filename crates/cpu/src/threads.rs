//! Splitting work across threads: one persistent pool per process.
//!
//! Spawning scoped threads per op costs 20–50 µs, and a decode step runs ~200 ops, so the
//! workers live for the whole process: after a job they spin briefly (the next op usually
//! follows within microseconds) and then park. A job is a number of tasks taken one at a time
//! from a shared counter, so a preempted worker (the machine is shared) only delays the tasks
//! it holds. Which thread runs a task never changes what the task computes.

use std::any::Any;
use std::cell::Cell;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long a worker spins for the next job before parking, and a submitter spins for the
/// workers before yielding.
const SPIN: Duration = Duration::from_micros(50);

/// Runs `f` over `threads` contiguous chunks of `0..n` and returns the results in order.
/// Runs inline for one thread or tiny `n`.
pub fn par_ranges<T: Send>(
    n: usize,
    threads: usize,
    f: impl Fn(Range<usize>) -> T + Sync,
) -> Vec<T> {
    let threads = threads.clamp(1, n.max(1));
    if threads == 1 {
        return vec![f(0..n)];
    }
    let chunk = n.div_ceil(threads);
    let slots: Vec<Mutex<Option<T>>> = (0..threads).map(|_| Mutex::new(None)).collect();
    par_tasks(threads, threads, |i| {
        let r = (i * chunk).min(n)..((i + 1) * chunk).min(n);
        let v = f(r);
        *slots[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
    });
    slots
        .into_iter()
        .map(|s| {
            s.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every task of a finished job has run")
        })
        .collect()
}

/// Runs `f(i)` for every `i` in `0..n_tasks` on up to `threads` threads (the caller is one of
/// them). Returns once every task has run; a panic in a task is resumed here.
pub fn par_tasks(n_tasks: usize, threads: usize, f: impl Fn(usize) + Sync) {
    let threads = threads.min(n_tasks);
    if threads <= 1 || IN_JOB.with(|c| c.get()) {
        // One thread, or a task that itself splits work: run inline.
        (0..n_tasks).for_each(f);
        return;
    }
    pool().run(n_tasks, threads - 1, &f);
}

/// The number of physical cores (logical CPUs / 2 when SMT siblings are listed, at least 1).
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let smt = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list")
        .map(|s| s.split([',', '-']).count() > 1)
        .unwrap_or(false);
    if smt {
        (logical / 2).max(1)
    } else {
        logical
    }
}

thread_local! {
    /// Set while this thread runs a task (nested splits run inline instead of deadlocking).
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
}

/// One job, living on the submitting thread's stack for the duration of [`Pool::run`].
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    n_tasks: usize,
    /// The next task index to take.
    next: AtomicUsize,
    /// Tasks finished (run or panicked).
    done: AtomicUsize,
    /// Workers holding a reference to this job.
    refs: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Job<'_> {
    /// Takes and runs tasks until none are left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n_tasks {
                return;
            }
            let was = IN_JOB.with(|c| c.replace(true));
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.f)(i)));
            IN_JOB.with(|c| c.set(was));
            if let Err(p) = r {
                let mut slot = self.panic.lock().unwrap_or_else(|e| e.into_inner());
                slot.get_or_insert(p);
            }
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

/// A `*const Job` with its lifetime erased; only dereferenced while the job's `refs` count
/// includes the reader (see [`Pool::run`]).
#[derive(Clone, Copy)]
struct JobPtr(*const Job<'static>);
// SAFETY: the pointee is Sync (atomics, a Mutex and a Sync closure) and outlives every use,
// because the submitter waits for `refs` to reach zero after unpublishing it.
unsafe impl Send for JobPtr {}

struct Shared {
    /// Bumped once per published job; workers compare it with the last one they saw.
    generation: AtomicU64,
    job: Mutex<Option<JobPtr>>,
    /// How many workers the current job wants (workers with a higher index stay asleep).
    wanted: AtomicUsize,
}

struct Pool {
    shared: &'static Shared,
    /// One submitter at a time; holds the workers' handles (grown on demand).
    workers: Mutex<Vec<Thread>>,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        shared: Box::leak(Box::new(Shared {
            generation: AtomicU64::new(0),
            job: Mutex::new(None),
            wanted: AtomicUsize::new(0),
        })),
        workers: Mutex::new(Vec::new()),
    })
}

impl Pool {
    fn run(&self, n_tasks: usize, helpers: usize, f: &(dyn Fn(usize) + Sync)) {
        let mut workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        while workers.len() < helpers {
            let shared = self.shared;
            let index = workers.len();
            let seen = shared.generation.load(Ordering::Acquire);
            let spawned = std::thread::Builder::new()
                .name(format!("minfer-cpu-{index}"))
                .spawn(move || worker(shared, index, seen));
            match spawned {
                Ok(h) => workers.push(h.thread().clone()),
                // No more threads available: run with the ones we have.
                Err(_) => break,
            }
        }
        let helpers = helpers.min(workers.len());
        let job = Job {
            f,
            n_tasks,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            refs: AtomicUsize::new(0),
            panic: Mutex::new(None),
        };
        // SAFETY (lifetime erasure): the pointer is unpublished and every reference dropped
        // (`refs == 0`) before `job` goes out of scope below.
        let ptr = JobPtr(std::ptr::from_ref(&job).cast::<Job<'static>>());
        *self.shared.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(ptr);
        self.shared.wanted.store(helpers, Ordering::SeqCst);
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
        for w in &workers[..helpers] {
            w.unpark();
        }
        job.work();
        wait_until(|| job.done.load(Ordering::Acquire) >= n_tasks);
        *self.shared.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        wait_until(|| job.refs.load(Ordering::Acquire) == 0);
        drop(workers);
        if let Some(p) = job.panic.into_inner().unwrap_or_else(|e| e.into_inner()) {
            std::panic::resume_unwind(p);
        }
    }
}

/// Counts spin iterations and tells when [`SPIN`] has passed (the clock is read every 64
/// iterations: `pause` takes 10–150 cycles depending on the CPU).
struct Spinner {
    n: u32,
    start: Option<Instant>,
}

impl Spinner {
    fn new() -> Self {
        Spinner { n: 0, start: None }
    }

    /// Spins once and returns true, or returns false once the spin time is used up.
    fn spin(&mut self) -> bool {
        self.n = self.n.wrapping_add(1);
        if self.n.is_multiple_of(64) {
            let start = *self.start.get_or_insert_with(Instant::now);
            if start.elapsed() > SPIN {
                return false;
            }
        }
        std::hint::spin_loop();
        true
    }
}

/// Spins, then yields, until `cond` holds.
fn wait_until(cond: impl Fn() -> bool) {
    let mut s = Spinner::new();
    while !cond() {
        if !s.spin() {
            std::thread::yield_now();
        }
    }
}

fn worker(shared: &'static Shared, index: usize, mut seen: u64) {
    loop {
        // Wait for a job newer than the last one seen.
        let mut s = Spinner::new();
        loop {
            let g = shared.generation.load(Ordering::SeqCst);
            if g != seen && index < shared.wanted.load(Ordering::SeqCst) {
                seen = g;
                break;
            }
            if g != seen {
                // A job that does not want this worker: skip it.
                seen = g;
            }
            if !s.spin() {
                // An unpark between the check above and here makes park return at once.
                std::thread::park();
            }
        }
        let ptr = {
            let slot = shared.job.lock().unwrap_or_else(|e| e.into_inner());
            match *slot {
                Some(p) => {
                    // SAFETY: published and not yet unpublished (we hold the lock), so the
                    // job is alive; the ref taken here keeps it alive until released.
                    unsafe { &*p.0 }.refs.fetch_add(1, Ordering::AcqRel);
                    p
                }
                None => continue,
            }
        };
        // SAFETY: our ref keeps the job alive until the fetch_sub below.
        let job = unsafe { &*ptr.0 };
        job.work();
        job.refs.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An output slice shared by the tasks of one job, each writing its own disjoint parts.
///
/// Tasks run on the pool's threads and need `&mut` access to their part of one output; this
/// wrapper carries the slice's pointer and length (bounds-checked on every access) and the
/// borrow's lifetime, so a part can never outlive the slice it came from.
#[derive(Clone, Copy)]
pub struct SharedOut<'a> {
    ptr: *mut f32,
    len: usize,
    _borrow: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: a `SharedOut` only hands out parts through the unsafe `part`, whose callers promise
// that concurrent parts are disjoint; f32 is Send, so sending the parts' writes is sound.
unsafe impl Send for SharedOut<'_> {}
// SAFETY: as above; shared references give no access except through `part`.
unsafe impl Sync for SharedOut<'_> {}

impl<'a> SharedOut<'a> {
    /// Shares `out` (mutably borrowed for as long as the wrapper lives).
    pub fn new(out: &'a mut [f32]) -> SharedOut<'a> {
        SharedOut {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            _borrow: std::marker::PhantomData,
        }
    }

    /// Elements in the shared slice.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Elements `start..start + len`.
    ///
    /// # Safety
    /// No other live reference (from another `part` call, on any thread) may overlap this
    /// range while the returned slice is used.
    ///
    /// # Panics
    /// When the range is outside the shared slice.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn part(&self, start: usize, len: usize) -> &'a mut [f32] {
        assert!(
            start <= self.len && len <= self.len - start,
            "part {start}..{} of a shared output of {}",
            start.saturating_add(len),
            self.len
        );
        // SAFETY: in bounds (checked above) of a slice borrowed for 'a; exclusive per the
        // caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}
