//! A render's wall-clock deadline.
//!
//! Fuel ([`super::RENDER_FUEL`]) counts minijinja's instructions, not what they cost: a list
//! grown by `ns.x = ns.x + [i]` in a `range(100000)` loop is about 10⁶ instructions and
//! 5·10⁹ value copies (43 s for one render; found by tests/template_fuzz.rs). minijinja 2.24
//! calls nothing per instruction, so the deadline is checked where it calls back into this
//! crate: every 64 items a `range` yields (a long loop's usual source: a string or a list
//! that long has to be built first, which the same checks see), every printed value, every
//! Python method (`.strip()`, `.items()`...) and `tojson`. A check past the deadline fails
//! the render; `range`, whose iterator cannot return an error, ends its loop instead and
//! marks the render, which then fails with the same message, its output thrown away.
//!
//! Not covered: a loop over a value already built (a long string's characters) whose body
//! calls none of these runs to its end (fuel bounds its instruction count only), and is
//! refused then, past the deadline (docs/RELIABILITY.md).

use minijinja::{Error, ErrorKind, Value};
use std::cell::Cell;
use std::time::{Duration, Instant};

/// The longest one render may take: far above a real template's microseconds to
/// milliseconds (a conversation of ten thousand messages), far below a hang.
pub const RENDER_DEADLINE: Duration = Duration::from_secs(1);

/// How many items a `range` yields between two clock reads.
const RANGE_CHECK_EVERY: usize = 64;

thread_local! {
    /// The deadline of the render running on this thread (minijinja renders on the caller's
    /// thread), None outside a render.
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
    /// Whether a check of that render found the deadline passed.
    static PASSED: Cell<bool> = const { Cell::new(false) };
}

/// The deadline of one render, armed until dropped (a nested render restores the outer one).
pub(crate) struct Armed {
    outer: (Option<Instant>, bool),
}

/// Arms [`RENDER_DEADLINE`] from now for the render on this thread.
pub(crate) fn arm() -> Armed {
    let outer = (DEADLINE.get(), PASSED.get());
    DEADLINE.set(Some(Instant::now() + RENDER_DEADLINE));
    PASSED.set(false);
    Armed { outer }
}

impl Armed {
    /// Whether the deadline passed: found by a check during the render, or now, once it
    /// has ended (a render none of the checks saw, that ran past it all the same, is
    /// refused too: it would make every request that slow).
    pub(crate) fn passed(&self) -> bool {
        passed_now()
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        DEADLINE.set(self.outer.0);
        PASSED.set(self.outer.1);
    }
}

/// Reads the clock; true (and the render marked) once the deadline has passed.
fn passed_now() -> bool {
    if PASSED.get() {
        return true;
    }
    let passed = DEADLINE.get().is_some_and(|d| Instant::now() >= d);
    PASSED.set(passed);
    passed
}

/// What a render past its deadline fails with.
pub(crate) fn message() -> String {
    format!(
        "the render ran past its deadline of {} s (a template loop whose work grows faster \
         than its length, e.g. a list rebuilt with `+` in every iteration)",
        RENDER_DEADLINE.as_secs_f64()
    )
}

/// The check of a callback that can fail the render.
pub(crate) fn check() -> Result<(), Error> {
    if passed_now() {
        return Err(Error::new(ErrorKind::InvalidOperation, message()));
    }
    Ok(())
}

/// minijinja's `range` (its arguments, its limit of 10⁵ items, lazy), yielding until the
/// deadline passes.
pub(crate) fn range(
    lower: isize,
    upper: Option<isize>,
    step: Option<isize>,
) -> Result<Value, Error> {
    check()?;
    let items = minijinja::functions::range(lower, upper, step)?;
    Ok(Value::make_object_iterable(items, |items| {
        let iter: Box<dyn Iterator<Item = Value> + Send + Sync> = match items.try_iter() {
            Ok(inner) => Box::new(UntilDeadline { inner, yielded: 0 }),
            // A range always iterates; nothing to yield otherwise.
            Err(_) => Box::new(std::iter::empty()),
        };
        iter
    }))
}

struct UntilDeadline<I> {
    inner: I,
    yielded: usize,
}

impl<I: Iterator<Item = Value>> Iterator for UntilDeadline<I> {
    type Item = Value;
    fn next(&mut self) -> Option<Value> {
        if self.yielded.is_multiple_of(RANGE_CHECK_EVERY) && passed_now() {
            return None;
        }
        self.yielded += 1;
        self.inner.next()
    }
    // The range's own size: `range(n) | length` and `if range(n)` read it.
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}
