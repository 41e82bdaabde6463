//! A trace's per-node GPU times (`Device::begin_span` .. `Device::take_spans`, docs/TRACE.md).
//!
//! Apple GPUs sample counters only at stage boundaries (`MTLCounterSamplingPointAtStageBoundary`,
//! not between dispatches), so a span is timed by its encoders: the device ends the open encoder
//! at each span boundary, and each encoder a span opens carries a sample-buffer attachment whose
//! start-of-encoder and end-of-encoder samples land in a timestamp-counter `MTLCounterSampleBuffer`
//! (pooled, two samples per encoder). After the command buffer completes the samples are
//! resolved (`resolveCounterRange`) and a span's time is the sum of its encoders' end − start.
//!
//! GPU ticks become nanoseconds by a rate measured against the host clock: `sampleTimestamps`
//! gives a GPU timestamp at device creation and again after each resolved submit, and ticks per
//! host nanosecond is their difference over the host `Instant`s between them. Measuring from
//! creation makes the baseline seconds long (pipelines are built and a model loaded before any
//! traced submit), so the few microseconds of skew between the two clocks' reads are a small
//! fraction of it. This avoids the CPU timestamp's own unit, which Apple documents only as
//! "absolute time or Mach absolute time" varying with the configuration.

use std::sync::Mutex;
use std::time::Instant;

use minfer_metal::{Error, Result};
use objc2::rc::Retained;
use objc2::runtime::ProtocolObject;
use objc2_foundation::NSRange;
use objc2_metal::{
    MTLCommonCounterSetTimestamp, MTLCounterErrorValue, MTLCounterSampleBuffer,
    MTLCounterSampleBufferDescriptor, MTLCounterSamplingPoint, MTLCounterSet, MTLDevice,
    MTLStorageMode,
};

/// What this device's span times are (a trace's `timing` for `metal`).
pub(crate) const SPAN_CLOCK: &str = "the GPU's timestamp counter at the start and end of each \
     of the node's encoders (counter sample buffer, stage-boundary sampling), summed, in ns by a \
     rate measured against the host clock";

/// Samples per counter sample buffer: 4096 timestamps of 8 bytes, 32 KiB. The headers state no
/// ceiling; 32 KiB is the size other Metal timestamp users keep to, and a refusal is loud (the
/// creation error names it). A command buffer that needs more takes another from the pool.
const SAMPLES_PER_BUFFER: usize = 4096;

type Device = ProtocolObject<dyn MTLDevice>;
pub(crate) type SampleBuffer = Retained<ProtocolObject<dyn MTLCounterSampleBuffer>>;

fn unavailable(what: String) -> Error {
    Error::Unavailable(what)
}

/// The device's span clock: the timestamp counter set, the calibration anchor, the pool of
/// sample buffers and the spans resolved but not yet taken.
pub(crate) struct SpanClock {
    counter_set: Retained<ProtocolObject<dyn MTLCounterSet>>,
    /// The host instant and the GPU timestamp sampled together at creation.
    anchor: (Instant, u64),
    pool: Mutex<Vec<SampleBuffer>>,
    /// (tag, ns) of the completed submits, in command order, each span once.
    done: Mutex<Vec<Done>>,
}

struct Done {
    tag: u32,
    seq: u64,
    ns: u64,
}

fn gpu_timestamp(device: &Device) -> u64 {
    let (mut cpu, mut gpu) = (0u64, 0u64);
    // SAFETY: both pointers are to live u64s (MTLTimestamp) for the call's duration.
    unsafe {
        device.sampleTimestamps_gpuTimestamp(
            std::ptr::NonNull::from(&mut cpu),
            std::ptr::NonNull::from(&mut gpu),
        )
    };
    gpu
}

impl SpanClock {
    /// The clock, or why this device cannot time spans (the trace then has no `metal` times).
    pub(crate) fn new(device: &Device) -> std::result::Result<SpanClock, String> {
        if !device.supportsCounterSampling(MTLCounterSamplingPoint::AtStageBoundary) {
            return Err("the device does not sample counters at stage boundaries".into());
        }
        // SAFETY: a constant NSString exported by Metal.
        let want = unsafe { MTLCommonCounterSetTimestamp }.to_string();
        let counter_set = device
            .counterSets()
            .map(|sets| sets.to_vec())
            .unwrap_or_default()
            .into_iter()
            .find(|s| s.name().to_string() == want)
            .ok_or_else(|| format!("the device has no `{want}` counter set"))?;
        let anchor = (Instant::now(), gpu_timestamp(device));
        if anchor.1 == 0 {
            return Err("sampleTimestamps gave a zero GPU timestamp".into());
        }
        Ok(SpanClock {
            counter_set,
            anchor,
            pool: Mutex::new(Vec::new()),
            done: Mutex::new(Vec::new()),
        })
    }

    fn sample_buffer(&self, device: &Device) -> Result<SampleBuffer> {
        if let Some(b) = self.pool.lock().ok().and_then(|mut p| p.pop()) {
            return Ok(b);
        }
        let desc = MTLCounterSampleBufferDescriptor::new();
        desc.setCounterSet(Some(&self.counter_set));
        // Shared: resolveCounterRange is only allowed on shared sample buffers.
        desc.setStorageMode(MTLStorageMode::Shared);
        // SAFETY: a plain count; Metal checks it when the buffer is made (an error, not UB).
        unsafe { desc.setSampleCount(SAMPLES_PER_BUFFER) };
        device
            .newCounterSampleBufferWithDescriptor_error(&desc)
            .map_err(|e| {
                unavailable(format!(
                    "counter sample buffer for a trace's node times: {}",
                    e.localizedDescription()
                ))
            })
    }

    /// GPU ticks per host nanosecond, measured from the creation anchor to now.
    fn ticks_per_ns(&self, device: &Device) -> Result<f64> {
        let gpu = gpu_timestamp(device);
        let host_ns = self.anchor.0.elapsed().as_nanos() as f64;
        let rate = gpu.wrapping_sub(self.anchor.1) as f64 / host_ns;
        if gpu <= self.anchor.1 || !rate.is_finite() || rate <= 0.0 {
            return Err(unavailable(format!(
                "GPU timestamp did not advance ({} at creation, {gpu} now): node times cannot \
                 be converted to ns",
                self.anchor.1
            )));
        }
        Ok(rate)
    }

    /// The spans resolved since the last take, each once, in command order.
    pub(crate) fn take(&self) -> Vec<(u32, u64)> {
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *done)
            .into_iter()
            .map(|d| (d.tag, d.ns))
            .collect()
    }
}

/// The encoders of one command buffer that carry samples.
#[derive(Default)]
pub(crate) struct CbSpans {
    /// Sample buffers in use, with how many samples of each are taken.
    bufs: Vec<(SampleBuffer, usize)>,
    encoders: Vec<Sampled>,
}

struct Sampled {
    tag: u32,
    /// Which span (a node may in principle be spanned twice): encoders of one span add up.
    seq: u64,
    buf: usize,
    /// The start-of-encoder sample; the end one follows it.
    index: usize,
}

/// The span open on the device: its tag and sequence number.
#[derive(Clone, Copy)]
pub(crate) struct Open {
    pub tag: u32,
    pub seq: u64,
}

impl CbSpans {
    /// The sample buffer and (start, end) sample indices for a new encoder of span `open`.
    pub(crate) fn slot(
        &mut self,
        clock: &SpanClock,
        device: &Device,
        open: Open,
    ) -> Result<(SampleBuffer, usize, usize)> {
        if self
            .bufs
            .last()
            .is_none_or(|(_, used)| used + 2 > SAMPLES_PER_BUFFER)
        {
            self.bufs.push((clock.sample_buffer(device)?, 0));
        }
        let buf = self.bufs.len() - 1;
        let (b, used) = &mut self.bufs[buf];
        let index = *used;
        *used += 2;
        self.encoders.push(Sampled {
            tag: open.tag,
            seq: open.seq,
            buf,
            index,
        });
        Ok((b.clone(), index, index + 1))
    }

    /// After the command buffer completed: the encoders' samples become span times (queued
    /// for [`SpanClock::take`]) and the sample buffers go back to the pool.
    pub(crate) fn resolve(mut self, clock: &SpanClock, device: &Device) -> Result<()> {
        if self.encoders.is_empty() {
            self.recycle(clock);
            return Ok(());
        }
        let rate = clock.ticks_per_ns(device);
        let mut stamps = Vec::with_capacity(self.bufs.len());
        for (b, used) in &self.bufs {
            // SAFETY: 0..used lies within the buffer's SAMPLES_PER_BUFFER samples.
            let data = unsafe { b.resolveCounterRange(NSRange::new(0, *used)) };
            let bytes = data.map(|d| d.to_vec()).unwrap_or_default();
            // MTLCounterResultTimestamp is one u64 per sample.
            let ts: Vec<u64> = bytes
                .chunks_exact(8)
                .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or([0xff; 8])))
                .collect();
            stamps.push(ts);
        }
        let encoders = std::mem::take(&mut self.encoders);
        self.recycle(clock);
        let rate = rate?;
        let mut done = clock
            .done
            .lock()
            .map_err(|_| unavailable("span list poisoned".into()))?;
        for e in encoders {
            let sample = |i: usize| {
                stamps[e.buf]
                    .get(i)
                    .copied()
                    .unwrap_or(MTLCounterErrorValue)
            };
            let (start, end) = (sample(e.index), sample(e.index + 1));
            if start == MTLCounterErrorValue || end == MTLCounterErrorValue || end < start {
                return Err(unavailable(format!(
                    "node {}'s encoder timestamps were not resolved (start {start:#x}, end \
                     {end:#x})",
                    e.tag
                )));
            }
            let ns = ((end - start) as f64 / rate).round() as u64;
            // A span whose work took more than one encoder (a blit between dispatches, a
            // flush mid-span) is one entry.
            match done.last_mut() {
                Some(d) if d.seq == e.seq => d.ns += ns,
                _ => done.push(Done {
                    tag: e.tag,
                    seq: e.seq,
                    ns,
                }),
            }
        }
        Ok(())
    }

    /// The sample buffers back to the pool, their samples dropped (a failed submit's).
    pub(crate) fn recycle(mut self, clock: &SpanClock) {
        if let Ok(mut pool) = clock.pool.lock() {
            pool.extend(self.bufs.drain(..).map(|(b, _)| b));
        }
    }
}
