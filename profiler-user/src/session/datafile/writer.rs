//! Writes a format-3 `profile.data` while recording. The collector packs
//! entries into a block ([`super::codec`], a few bytes per event, no
//! allocation); a full block (about 1 MiB), or one a second old, goes to a
//! thread that compresses, checksums and writes it, so the collector never
//! waits on zstd or the disk unless that thread is [`QUEUE`] blocks behind.
//! A killed agent loses at most the last second.
use std::{
    fs::File,
    io::{self, Write},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc::{self, Receiver, SyncSender},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use super::{block, codec::Encoder, Entry, Header, Totals, Trailer, MAGIC, VERSION};

/// Raw content of a block before it is sealed.
const BLOCK_BYTES: usize = 1 << 20;
/// A block is sealed at least this often while entries arrive.
const BLOCK_AGE: Duration = Duration::from_secs(1);
/// Blocks queued for the writing thread before the collector waits.
const QUEUE: usize = 16;

enum Msg {
    Block { content: Vec<u8>, entries: u64 },
    Finish(Box<Trailer>),
}

/// What the writing thread tells when it is done.
#[derive(Debug, Clone, Default)]
pub struct Written {
    /// The file's size.
    pub bytes: u64,
    /// Totals, as written in the trailer.
    pub totals: Totals,
    /// CPU time the writing thread spent (compressing, checksumming, writing).
    pub cpu_ns: u64,
    /// Entries left out past `--data-limit`.
    pub cut: u64,
}

/// The writing thread's state, shared for its first error.
#[derive(Default)]
struct Shared {
    failed: AtomicBool,
    error: Mutex<Option<(u64, io::Error)>>,
}

/// Streams `profile.data`.
pub struct DataWriter {
    enc: Encoder,
    since: Instant,
    tx: Option<SyncSender<Msg>>,
    free: Receiver<Vec<u8>>,
    thread: Option<JoinHandle<Written>>,
    shared: Arc<Shared>,
    told: bool,
    records: u64,
    events: u64,
    format2: u64,
}

/// Bytes the same entry took in format 2 (`[tag][u32 len][payload]`).
fn format2_len(e: &Entry) -> u64 {
    5 + match e {
        Entry::Record(r) => r.len(),
        Entry::Tick(_) => 8,
        Entry::Reap(_, t) => 1 + 4 * t.len(),
        Entry::Name(_, n) => 4 + n.len(),
        // Not in format 2.
        Entry::Lost(..) => return 0,
    } as u64
}

impl DataWriter {
    /// Writes the file's start and header block, and starts the writing
    /// thread; entries past `limit` bytes of file are left out.
    pub fn create(mut file: File, header: &Header, limit: u64) -> io::Result<Self> {
        let json = serde_json::to_vec(header).expect("plain data");
        let mut start = MAGIC.to_vec();
        start.extend_from_slice(&VERSION.to_le_bytes());
        start.extend_from_slice(&block::seal(block::KIND_HEADER, &json)?);
        file.write_all(&start)?;
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let (free_tx, free) = mpsc::channel();
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let written = start.len() as u64;
        let thread = std::thread::Builder::new()
            .name("profile.data".into())
            .spawn(move || write_blocks(file, rx, free_tx, &s, written, limit))?;
        Ok(DataWriter {
            enc: Encoder::default(),
            since: Instant::now(),
            tx: Some(tx),
            free,
            thread: Some(thread),
            shared,
            told: false,
            records: 0,
            events: 0,
            format2: 12 + 5 + json.len() as u64,
        })
    }

    /// A raw ring record.
    #[inline]
    pub fn record(&mut self, rec: &[u8]) {
        self.records += 1;
        self.format2 += 5 + rec.len() as u64;
        if self.enc.record(rec) {
            self.events += 1;
        }
        if self.enc.buf.len() >= BLOCK_BYTES {
            self.seal();
        }
    }

    fn journal(&mut self, e: &Entry) {
        self.format2 += format2_len(e);
        self.enc.entry(e);
    }

    /// A hang check at `now_ns`.
    pub fn tick(&mut self, now_ns: u64) {
        self.journal(&Entry::Tick(now_ns));
    }

    /// Threads folded as exited.
    pub fn reap(&mut self, now: bool, tids: &[u32]) {
        self.journal(&Entry::Reap(now, tids.to_vec()));
    }

    /// A thread name read from /proc.
    pub fn name(&mut self, tid: u32, name: &str) {
        self.journal(&Entry::Name(tid, name.to_string()));
    }

    /// The kernel's loss counters so far.
    pub fn lost(&mut self, events: u64, sched: u64, comm: u64) {
        self.journal(&Entry::Lost(events, sched, comm));
    }

    /// Seals the block if it is a second old; says once, on stderr, that
    /// the file could not be written (a full disk).
    pub fn seal_if_due(&mut self) {
        if self.enc.entries > 0 && self.since.elapsed() >= BLOCK_AGE {
            self.seal();
        }
        if !self.told && self.shared.failed.load(Ordering::Relaxed) {
            self.told = true;
            if let Some((at, e)) = &*self.shared.error.lock().expect("not poisoned") {
                eprintln!(
                    "profiler: warning: writing profile.data failed at byte {at} ({}): it keeps what was written before; recording goes on",
                    describe(e)
                );
            }
        }
    }

    /// Hands the block to the writing thread.
    pub(super) fn seal(&mut self) {
        self.since = Instant::now();
        if self.enc.entries == 0 {
            return;
        }
        let next = self
            .free
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(BLOCK_BYTES + 1024));
        let entries = self.enc.entries;
        let content = std::mem::take(&mut self.enc.buf);
        self.enc.reset(next);
        if let Some(tx) = &self.tx {
            // The thread only goes away by panicking; the error says so at finish.
            let _ = tx.send(Msg::Block { content, entries });
        }
    }

    /// Writes the last block and the trailer (with the totals), and waits
    /// for the file to be written. Returns the first write error.
    pub fn finish(mut self, trailer: &Trailer) -> io::Result<Written> {
        self.seal();
        let mut trailer = trailer.clone();
        trailer.totals = Some(Totals {
            records: self.records,
            events: self.events,
            format2_bytes: self.format2,
            ..Totals::default()
        });
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Msg::Finish(Box::new(trailer)));
        }
        let done = self
            .thread
            .take()
            .expect("finished once")
            .join()
            .map_err(|_| io::Error::other("the profile.data writing thread panicked"))?;
        if done.cut > 0 {
            eprintln!(
                "profiler: note: profile.data reached --data-limit; the last {} entries were left out, so a replay covers only the part before",
                done.cut
            );
        }
        match self.shared.error.lock().expect("not poisoned").take() {
            Some((at, e)) => Err(io::Error::new(
                e.kind(),
                format!(
                    "{} (profile.data holds what came before byte {at})",
                    describe(&e)
                ),
            )),
            None => Ok(done),
        }
    }
}

/// An I/O error in words; a full disk is named as such.
fn describe(e: &io::Error) -> String {
    if e.raw_os_error() == Some(libc::ENOSPC) {
        format!("the disk is full: {e}")
    } else {
        e.to_string()
    }
}

/// CPU time of the calling thread.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which lives on our stack.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The writing thread: seals each block and appends it, until the trailer.
/// After a write error nothing more is written (the file ends at its last
/// whole block, or inside the one that failed); past `limit`, blocks are
/// left out and counted, and only the trailer is written.
fn write_blocks(
    mut file: File,
    rx: Receiver<Msg>,
    free: mpsc::Sender<Vec<u8>>,
    shared: &Shared,
    mut written: u64,
    limit: u64,
) -> Written {
    let mut done = Written::default();
    let (mut blocks, mut raw) = (1u64, 0u64);
    let mut put = |bytes: io::Result<Vec<u8>>, written: &mut u64| {
        if shared.failed.load(Ordering::Relaxed) {
            return;
        }
        if let Err(e) = bytes.and_then(|b| {
            file.write_all(&b)?;
            *written += b.len() as u64;
            Ok(())
        }) {
            *shared.error.lock().expect("not poisoned") = Some((*written, e));
            shared.failed.store(true, Ordering::Relaxed);
        }
    };
    while let Ok(msg) = rx.recv() {
        match msg {
            Msg::Block { .. } if shared.failed.load(Ordering::Relaxed) => {}
            Msg::Block { content, entries } => {
                let sealed = block::seal(block::KIND_ENTRIES, &content);
                let fits = sealed
                    .as_ref()
                    .map_or(true, |b| written + b.len() as u64 <= limit);
                if done.cut > 0 || !fits {
                    done.cut += entries;
                } else {
                    blocks += 1;
                    raw += content.len() as u64;
                    put(sealed, &mut written);
                }
                let _ = free.send(content);
            }
            Msg::Finish(mut trailer) => {
                trailer.complete = done.cut == 0;
                if let Some(t) = &mut trailer.totals {
                    t.blocks = blocks + 1;
                    t.content_bytes = raw;
                    t.cut_entries = done.cut;
                    done.totals = t.clone();
                }
                let json = serde_json::to_vec(&trailer).expect("plain data");
                put(block::seal(block::KIND_TRAILER, &json), &mut written);
                break;
            }
        }
    }
    done.bytes = written;
    done.cpu_ns = thread_cpu_ns();
    done
}
