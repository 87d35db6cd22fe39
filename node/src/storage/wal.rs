//! The write-ahead log: what makes a batch durable with one sequential write and one
//! `fdatasync`, however many streams it touches.
//!
//! Segments are files `{first_seq:020}.wal`, zero-filled ahead of use so that a sync never has
//! to update file metadata. A record is `[len: u32][crc32c: u32][seq: u64][payload]`, the CRC
//! covering seq and payload. Reading stops at the first record that is empty, torn, fails its
//! CRC or breaks the sequence: that is where the last acknowledged write ended.

use super::AppendTo;
use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

const HEADER: usize = 16;
const SPARE: &str = "spare.wal.tmp";
/// The write buffer keeps its capacity between records up to this size.
const MAX_KEPT_BUFFER: usize = 4 << 20;

struct Segment {
    last_seq: u64,
    path: PathBuf,
}

pub struct Wal {
    dir: PathBuf,
    segment_size: u64,
    closed: VecDeque<Segment>,
    active: Segment,
    file: File,
    write_pos: u64,
    last_seq: u64,
    /// A zero-fill of the spare segment file, in progress or done.
    spare: Option<JoinHandle<io::Result<()>>>,
    /// The spare segment file is a recycled old segment, ready to use.
    recycled: bool,
    buffer: Vec<u8>,
    /// Records not yet covered by a checkpoint: (seq, bytes), oldest first.
    unsnapshotted: VecDeque<(u64, u64)>,
    unsnapshotted_bytes: u64,
}

/// A record read back at start-up.
pub struct Replay {
    pub seq: u64,
    pub payload: Vec<u8>,
}

impl Wal {
    /// Opens the log in `dir`, returning it and every intact record, oldest first.
    pub fn open(dir: &Path, segment_size: u64) -> io::Result<(Self, Vec<Replay>)> {
        fs::create_dir_all(dir)?;
        let _ = fs::remove_file(dir.join(SPARE));
        let mut firsts: Vec<u64> = fs::read_dir(dir)?
            .filter_map(|entry| entry.ok())
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                name.strip_suffix(".wal")?.parse().ok()
            })
            .collect();
        firsts.sort_unstable();

        let mut records = Vec::new();
        let mut closed = VecDeque::new();
        let mut active = None;
        let mut expected_seq: Option<u64> = None;
        for (i, first) in firsts.iter().enumerate() {
            let path = dir.join(segment_name(*first));
            let mut bytes = Vec::new();
            File::open(&path)?.read_to_end(&mut bytes)?;
            let (end, last) = scan(&bytes, &mut expected_seq, &mut records);
            let segment = Segment {
                last_seq: last.unwrap_or(first.saturating_sub(1)),
                path,
            };
            let is_last = i + 1 == firsts.len();
            // What follows a closed segment's records is either zeros or the old records of a
            // recycled segment, which cannot be told from a torn write byte by byte. Segment
            // names can: the next segment must start with the very next record.
            let torn = firsts
                .get(i + 1)
                .is_some_and(|next| Some(*next) != expected_seq.or(Some(*first)));
            if is_last {
                active = Some((segment, end as u64));
            } else if torn {
                // A torn record in an older segment means later segments cannot be trusted.
                tracing::warn!(segment = %segment.path.display(), "WAL segment ends in a torn record; later segments ignored");
                active = Some((segment, end as u64));
                for later in &firsts[i + 1..] {
                    let _ = fs::remove_file(dir.join(segment_name(*later)));
                }
                break;
            } else {
                closed.push_back(segment);
            }
        }
        let last_seq = records.last().map_or(0, |r: &Replay| r.seq);
        let (active, write_pos) = match active {
            Some(found) => found,
            None => {
                let first = last_seq + 1;
                let path = dir.join(segment_name(first));
                zero_fill(&path, segment_size)?;
                sync_dir(dir)?;
                (Segment { last_seq, path }, 0)
            }
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&active.path)?;
        let mut wal = Self {
            dir: dir.to_owned(),
            segment_size,
            closed,
            active,
            file,
            write_pos,
            last_seq,
            spare: None,
            recycled: false,
            buffer: Vec::new(),
            unsnapshotted: VecDeque::new(),
            unsnapshotted_bytes: 0,
        };
        wal.prepare_spare();
        Ok((wal, records))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn segment_size(&self) -> u64 {
        self.segment_size
    }

    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Continues numbering after `seq` (the checkpoint) when the WAL holds nothing newer, so a
    /// new record is never numbered at or below what the checkpoint already covers.
    pub fn continue_after(&mut self, seq: u64) {
        self.last_seq = self.last_seq.max(seq);
    }

    /// Appends one record and returns once it is on disk.
    #[cfg(test)]
    pub fn append(&mut self, seq: u64, payload: &[u8]) -> io::Result<()> {
        self.buffer.clear();
        self.buffer.reserve(HEADER + payload.len());
        self.buffer.resize(HEADER, 0);
        self.buffer.extend_from_slice(payload);
        self.append_staged(seq)
    }

    /// Encodes `value` as the payload of the next record, straight into the log's write
    /// buffer: a batch's record is built once, in a buffer that keeps its capacity, instead of
    /// in a fresh `Vec` that doubles its way up and is then copied again.
    pub fn stage<T: serde::Serialize + ?Sized>(&mut self, value: &T) -> postcard::Result<()> {
        self.buffer.clear();
        self.buffer.resize(HEADER, 0);
        postcard::serialize_with_flavor(value, AppendTo(&mut self.buffer))
    }

    /// Writes the payload staged by [`Wal::stage`] as record `seq` and fsyncs it.
    pub fn append_staged(&mut self, seq: u64) -> io::Result<()> {
        if self.buffer.len() < HEADER {
            return Err(io::Error::other("no WAL record staged"));
        }
        let len = self.buffer.len();
        let payload_len =
            u32::try_from(len - HEADER).map_err(|_| io::Error::other("a WAL record over 4 GiB"))?;
        let checksum = crc(seq, &self.buffer[HEADER..]);
        self.buffer[0..4].copy_from_slice(&payload_len.to_le_bytes());
        self.buffer[4..8].copy_from_slice(&checksum.to_le_bytes());
        self.buffer[8..16].copy_from_slice(&seq.to_le_bytes());
        if self.write_pos + len as u64 > self.segment_size && self.write_pos > 0 {
            self.roll(seq)?;
        }
        self.file.write_all_at(&self.buffer, self.write_pos)?;
        if self.write_pos + len as u64 > self.segment_size {
            // A record larger than a segment grew the file: its size must be synced too.
            self.file.sync_all()?;
        } else {
            self.file.sync_data()?;
        }
        // Written once: a second `append_staged` without a new `stage` is refused.
        self.buffer.clear();
        if self.buffer.capacity() > MAX_KEPT_BUFFER {
            // One huge record (a large snapshot) should not pin its size for good.
            self.buffer = Vec::new();
        }
        self.write_pos += len as u64;
        self.unsnapshotted.push_back((seq, len as u64));
        self.unsnapshotted_bytes += len as u64;
        self.active.last_seq = seq;
        self.last_seq = seq;
        // Half way through a segment with no recycled one in sight, start zero-filling the
        // next in the background.
        if !self.recycled && self.spare.is_none() && self.write_pos > self.segment_size / 2 {
            self.prepare_spare();
        }
        Ok(())
    }

    /// Drops segments whose every record is at or below `seq` (they are in the checkpoint).
    /// One is kept as the next spare segment: reusing a file that is already allocated and
    /// written spares the disk a zero-fill of a whole segment.
    pub fn purge_through(&mut self, seq: u64) {
        while let Some(&(oldest, len)) = self.unsnapshotted.front() {
            if oldest > seq {
                break;
            }
            self.unsnapshotted.pop_front();
            self.unsnapshotted_bytes -= len;
        }
        while self.closed.front().is_some_and(|s| s.last_seq <= seq) {
            let Some(segment) = self.closed.pop_front() else {
                break;
            };
            let zero_fill_running = self.spare.as_ref().is_some_and(|h| !h.is_finished());
            if !self.recycled && !zero_fill_running {
                if let Some(done) = self.spare.take() {
                    let _ = done.join();
                }
                // The rename replaces a zero-filled spare, if there is one.
                match recycle(&segment.path, &self.dir.join(SPARE)) {
                    Ok(()) => {
                        self.recycled = true;
                        continue;
                    }
                    Err(error) => tracing::warn!(%error, "cannot recycle a WAL segment"),
                }
            }
            if let Err(error) = fs::remove_file(&segment.path) {
                tracing::warn!(%error, path = %segment.path.display(), "cannot delete WAL segment");
            }
        }
    }

    /// Bytes of records appended since the last checkpoint (in this run).
    pub fn unsnapshotted_bytes(&self) -> u64 {
        self.unsnapshotted_bytes
    }

    pub fn segment_count(&self) -> usize {
        self.closed.len() + 1
    }

    fn roll(&mut self, next_seq: u64) -> io::Result<()> {
        let path = self.dir.join(segment_name(next_seq));
        let spare_ready = if std::mem::take(&mut self.recycled) {
            true
        } else {
            match self.spare.take() {
                Some(handle) => matches!(handle.join(), Ok(Ok(()))),
                None => false,
            }
        };
        if spare_ready {
            fs::rename(self.dir.join(SPARE), &path)?;
        } else {
            zero_fill(&path, self.segment_size)?;
        }
        sync_dir(&self.dir)?;
        let file = OpenOptions::new().read(true).write(true).open(&path)?;
        let finished = std::mem::replace(
            &mut self.active,
            Segment {
                last_seq: next_seq.saturating_sub(1),
                path,
            },
        );
        self.closed.push_back(finished);
        self.file = file;
        self.write_pos = 0;
        Ok(())
    }

    /// Zero-fills the next segment in the background, so rolling over does not stall writes.
    fn prepare_spare(&mut self) {
        let path = self.dir.join(SPARE);
        let size = self.segment_size;
        self.spare = std::thread::Builder::new()
            .name("ursula-wal-spare".into())
            .spawn(move || zero_fill(&path, size))
            .ok();
    }
}

fn segment_name(first_seq: u64) -> String {
    format!("{first_seq:020}.wal")
}

fn crc(seq: u64, payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&seq.to_le_bytes()), payload)
}

/// Parses records from `bytes`; returns where the intact ones end and the last seq.
fn scan(bytes: &[u8], expected: &mut Option<u64>, out: &mut Vec<Replay>) -> (usize, Option<u64>) {
    let mut pos = 0;
    let mut last = None;
    while pos + HEADER <= bytes.len() {
        let field = |at: usize, n: usize| &bytes[pos + at..pos + at + n];
        let len = u32::from_le_bytes(field(0, 4).try_into().unwrap_or_default()) as usize;
        let stored_crc = u32::from_le_bytes(field(4, 4).try_into().unwrap_or_default());
        let seq = u64::from_le_bytes(field(8, 8).try_into().unwrap_or_default());
        if (len == 0 && stored_crc == 0) || pos + HEADER + len > bytes.len() {
            break;
        }
        let payload = &bytes[pos + HEADER..pos + HEADER + len];
        if crc(seq, payload) != stored_crc || expected.is_some_and(|e| e != seq) {
            break;
        }
        out.push(Replay {
            seq,
            payload: payload.to_vec(),
        });
        *expected = Some(seq + 1);
        last = Some(seq);
        pos += HEADER + len;
    }
    (pos, last)
}

fn zero_fill(path: &Path, size: u64) -> io::Result<()> {
    let mut file = File::create(path)?;
    let chunk = vec![0u8; 1 << 20];
    let mut written = 0;
    while written < size {
        let n = chunk.len().min((size - written) as usize);
        file.write_all(&chunk[..n])?;
        written += n as u64;
    }
    file.sync_all()
}

/// Turns a purged segment into the spare. Its first record header is zeroed first, so that
/// until new records overwrite them, its old records read as the end of the log; any old record
/// after the new ones breaks the sequence and is ignored too.
fn recycle(segment: &Path, spare: &Path) -> io::Result<()> {
    let file = OpenOptions::new().write(true).open(segment)?;
    file.write_all_at(&[0u8; HEADER], 0)?;
    file.sync_data()?;
    fs::rename(segment, spare)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recycled segment, once filled and closed, still holds old records after its new
    /// ones. They are a clean end, not a torn record: the segments after it must survive.
    #[test]
    fn segments_after_a_closed_recycled_segment_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), 4096).unwrap();
        // Smaller records first: the larger ones written over them later end short of the
        // segment's old end and leave parts of old records behind.
        for seq in 1..=100u64 {
            wal.append(seq, &[1; 100]).unwrap();
        }
        if let Some(spare) = wal.spare.take() {
            spare.join().unwrap().unwrap();
        }
        wal.purge_through(35);
        assert!(wal.recycled, "the first segment became the spare");
        // Fill the recycled segment and roll past it.
        for seq in 101..=120u64 {
            wal.append(seq, &[2; 300]).unwrap();
        }
        assert!(!wal.recycled, "the recycled segment was used");
        drop(wal);
        let (_, replay) = Wal::open(dir.path(), 4096).unwrap();
        let seqs: Vec<u64> = replay.iter().map(|r| r.seq).collect();
        assert_eq!(seqs.last(), Some(&120), "the newest records are there");
        let first = seqs[0];
        assert_eq!(seqs, (first..=120).collect::<Vec<_>>());
    }

    #[test]
    fn records_survive_reopen_and_rollover() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, replay) = Wal::open(dir.path(), 4096).unwrap();
        assert!(replay.is_empty());
        for seq in 1..=100u64 {
            wal.append(seq, &[seq as u8; 100]).unwrap();
        }
        assert!(wal.segment_count() > 1);
        drop(wal);
        let (mut wal, replay) = Wal::open(dir.path(), 4096).unwrap();
        assert_eq!(replay.len(), 100);
        for (i, record) in replay.iter().enumerate() {
            assert_eq!(record.seq, i as u64 + 1);
            assert_eq!(record.payload, vec![record.seq as u8; 100]);
        }
        wal.append(101, b"after reopen").unwrap();
        // Let the background zero-fill of the spare finish, as it has in any real run.
        if let Some(spare) = wal.spare.take() {
            spare.join().unwrap().unwrap();
        }
        wal.purge_through(50);
        assert!(wal.recycled, "a purged segment became the spare");
        // Fill segments until the recycled one is in use again, then reopen.
        for seq in 102..=160u64 {
            wal.append(seq, &[seq as u8; 100]).unwrap();
        }
        drop(wal);
        let (_, replay) = Wal::open(dir.path(), 4096).unwrap();
        assert!(replay.first().unwrap().seq <= 51);
        let seqs: Vec<u64> = replay.iter().map(|r| r.seq).collect();
        let first = seqs[0];
        assert_eq!(
            seqs,
            (first..=160).collect::<Vec<_>>(),
            "old records of a recycled segment never reappear"
        );
        assert_eq!(
            replay.iter().find(|r| r.seq == 101).unwrap().payload,
            b"after reopen"
        );
    }

    /// A staged record is the value's postcard encoding, read back intact after a reopen,
    /// however many records staged before it (each staging starts from an empty payload).
    #[test]
    fn staged_records_read_back_as_their_encoding() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), 4096).unwrap();
        let values: Vec<Vec<String>> = (0..40u64)
            .map(|i| (0..i % 7).map(|j| format!("record {i} item {j}")).collect())
            .collect();
        for (seq, value) in (1u64..).zip(&values) {
            wal.stage(value).unwrap();
            wal.append_staged(seq).unwrap();
        }
        // A staged record is written once, and one never written leaves no trace.
        assert!(wal.append_staged(41).is_err());
        wal.stage(&vec!["abandoned".to_owned()]).unwrap();
        drop(wal);
        let (_, replay) = Wal::open(dir.path(), 4096).unwrap();
        let decoded: Vec<Vec<String>> = replay
            .iter()
            .map(|r| postcard::from_bytes(&r.payload).unwrap())
            .collect();
        assert_eq!(decoded, values);
    }

    #[test]
    fn a_torn_tail_is_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), 1 << 20).unwrap();
        wal.append(1, b"one").unwrap();
        wal.append(2, b"two").unwrap();
        let path = wal.active.path.clone();
        let end = wal.write_pos;
        drop(wal);
        // Corrupt the last record's payload, as a crash in the middle of its write would.
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(b"X", end - 1).unwrap();
        let (mut wal, replay) = Wal::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(replay.len(), 1);
        assert_eq!(replay[0].payload, b"one");
        wal.append(2, b"again").unwrap();
        drop(wal);
        let (_, replay) = Wal::open(dir.path(), 1 << 20).unwrap();
        let payloads: Vec<&[u8]> = replay.iter().map(|r| r.payload.as_slice()).collect();
        assert_eq!(payloads, vec![&b"one"[..], &b"again"[..]]);
    }
}
