//! The node's SSE byte stream cut into batches of whole events, and each client's view of a
//! batch: the node's bytes as they are, or with control events that carry the client's own
//! cursor.

use std::collections::VecDeque;
use std::ops::Range;

use bytes::{Bytes, BytesMut};

/// Whole events, ready to relay: no data event without the control event after it.
#[derive(Debug)]
pub(super) struct Batch {
    pub bytes: Bytes,
    /// The control events in `bytes`, in order.
    pub controls: Vec<ControlAt>,
}

#[derive(Debug)]
pub(super) struct ControlAt {
    range: Range<usize>,
    /// `None` if it could not be read: relayed as it is, and nobody joins after it.
    pub control: Option<Control>,
}

/// What a control event says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Control {
    pub next_offset: String,
    pub up_to_date: bool,
    /// The closing control event: the node ends the subscription after it.
    pub closed: bool,
}

impl Batch {
    /// The last control event, if the batch has one.
    pub fn last_control(&self) -> Option<&ControlAt> {
        self.controls.last()
    }

    /// The batch for a client whose control events carry a cursor of its own (`cursor`
    /// gives one per event, from the client's `cursor::Session`, as the node's session does):
    /// the node's bytes between them are shared, not copied. The closing control event
    /// carries no cursor and is kept.
    pub fn render(&self, mut cursor: impl FnMut() -> String, out: &mut VecDeque<Bytes>) {
        let mut at = 0;
        for ControlAt { range, control } in &self.controls {
            let Some(control) = control.as_ref().filter(|c| !c.closed) else {
                continue;
            };
            if range.start > at {
                out.push_back(self.bytes.slice(at..range.start));
            }
            out.push_back(control_event(
                &control.next_offset,
                &cursor(),
                control.up_to_date,
            ));
            at = range.end;
        }
        if at < self.bytes.len() {
            out.push_back(self.bytes.slice(at..));
        }
    }
}

/// A control event as the node writes it (`node/src/http/sse.rs`).
pub(super) fn control_event(next_offset: &str, cursor: &str, up_to_date: bool) -> Bytes {
    let up_to_date = if up_to_date { ",\"upToDate\":true" } else { "" };
    Bytes::from(format!(
        "event: control\ndata:{{\"streamNextOffset\":\"{next_offset}\",\"streamCursor\":\"{cursor}\"{up_to_date}}}\n\n"
    ))
}

/// Bytes of the node's event stream not yet relayed.
#[derive(Default)]
pub(super) struct Events {
    buffer: BytesMut,
    /// How far `buffer` has been split into complete events.
    scanned: usize,
    /// Where the search for the end of the next event goes on: a large event arrives in
    /// many frames, and each is searched once.
    searched: usize,
    /// The end of the complete events that can be relayed: a data event waits for the
    /// control event after it, and so does anything behind it.
    releasable: usize,
    controls: Vec<ControlAt>,
}

impl Events {
    pub fn push(&mut self, data: &[u8]) {
        self.buffer.extend_from_slice(data);
        loop {
            let Some(found) = self.buffer[self.searched..]
                .windows(2)
                .position(|w| w == b"\n\n")
            else {
                // The last byte may be the first half of the blank line.
                self.searched = self.buffer.len().saturating_sub(1).max(self.scanned);
                return;
            };
            let end = self.searched + found + 2;
            let event = &self.buffer[self.scanned..end];
            let nothing_waits = self.releasable == self.scanned;
            if event.starts_with(b"event: control\n") {
                self.controls.push(ControlAt {
                    range: self.scanned..end,
                    control: parse_control(event),
                });
                self.releasable = end;
            } else if nothing_waits && !event.starts_with(b"event: data\n") {
                // A comment (keep-alive) with no data event waiting before it.
                self.releasable = end;
            }
            self.scanned = end;
            self.searched = end;
        }
    }

    pub fn release(&mut self) -> Option<Batch> {
        if self.releasable == 0 {
            return None;
        }
        let bytes = self.buffer.split_to(self.releasable).freeze();
        self.scanned -= self.releasable;
        self.searched -= self.releasable;
        self.releasable = 0;
        Some(Batch {
            bytes,
            controls: std::mem::take(&mut self.controls),
        })
    }
}

fn parse_control(event: &[u8]) -> Option<Control> {
    let text = std::str::from_utf8(event).ok()?;
    let data = text.lines().find_map(|line| line.strip_prefix("data:"))?;
    let value: serde_json::Value = serde_json::from_str(data.trim_start()).ok()?;
    let flag = |name: &str| value.get(name).and_then(serde_json::Value::as_bool) == Some(true);
    Some(Control {
        next_offset: value.get("streamNextOffset")?.as_str()?.to_owned(),
        up_to_date: flag("upToDate"),
        closed: flag("streamClosed"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const P1: &str = "0000000000000000_0000000000000005";
    const P2: &str = "0000000000000000_0000000000000009";
    const CLOSING: &str = "event: control\ndata:{\"streamNextOffset\":\"0000000000000000_0000000000000011\",\"streamClosed\":true,\"upToDate\":true}\n\n";

    fn control(offset: &str) -> String {
        String::from_utf8(control_event(offset, "7", true).to_vec()).unwrap()
    }

    fn data(text: &str) -> String {
        format!("event: data\ndata:{text}\n\n")
    }

    fn text(bytes: &[u8]) -> String {
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    /// Every way of cutting the node's bytes into frames relays the same events, each data
    /// event together with its control event, and the position after them.
    #[test]
    fn events_are_relayed_whole_however_the_bytes_arrive() {
        let stream = format!(
            "{}{}{}: keep-alive\n\n{}{CLOSING}",
            control(P1),
            data("a"),
            control(P2),
            data("b"),
        );
        let bytes = stream.as_bytes();
        for cut in 1..bytes.len() {
            for second in [cut, (cut + 7).min(bytes.len())] {
                let mut events = Events::default();
                let mut relayed = Vec::new();
                for piece in [&bytes[..cut], &bytes[cut..second], &bytes[second..]] {
                    events.push(piece);
                    if let Some(batch) = events.release() {
                        let text = text(&batch.bytes);
                        // Nothing relayed ends inside an event or between data and control.
                        assert!(text.ends_with("\n\n"), "{text:?}");
                        assert!(!text.ends_with(&data("a")) && !text.ends_with(&data("b")));
                        for at in &batch.controls {
                            assert!(text[at.range.clone()].starts_with("event: control\n"));
                        }
                        relayed.push(batch);
                    }
                }
                let all: String = relayed.iter().map(|b| text(&b.bytes)).collect();
                assert_eq!(all, stream, "cut at {cut}, {second}");
                let offsets: Vec<String> = relayed
                    .iter()
                    .flat_map(|b| &b.controls)
                    .map(|at| at.control.clone().unwrap().next_offset)
                    .collect();
                assert_eq!(offsets, [P1, P2, "0000000000000000_0000000000000011"]);
                let last = relayed.last().unwrap().last_control().unwrap();
                let last = last.control.as_ref().unwrap();
                assert!(last.closed && last.up_to_date);
            }
        }
    }

    #[test]
    fn a_keep_alive_waits_behind_a_data_event_and_unreadable_controls_are_kept() {
        let mut events = Events::default();
        events.push(data("a").as_bytes());
        events.push(b": keep-alive\n\n");
        assert!(events.release().is_none());
        events.push(control(P2).as_bytes());
        let batch = events.release().unwrap();
        assert_eq!(
            batch.last_control().unwrap().control,
            Some(Control {
                next_offset: P2.into(),
                up_to_date: true,
                closed: false,
            })
        );
        events.push(b": keep-alive\n\n");
        let batch = events.release().unwrap();
        assert_eq!(&batch.bytes[..], b": keep-alive\n\n");
        assert!(batch.last_control().is_none());
        events.push(b"event: control\ndata:{oops\n\n");
        assert!(
            events
                .release()
                .unwrap()
                .last_control()
                .unwrap()
                .control
                .is_none()
        );
    }

    #[test]
    fn a_large_event_in_many_frames_is_found_once_it_ends() {
        let payload = "x".repeat(100_000);
        let stream = format!("{}{}", data(&payload), control(P1));
        let mut events = Events::default();
        for piece in stream.as_bytes().chunks(1000) {
            events.push(piece);
            // The search never goes back over what it has looked at.
            assert!(events.searched + 1 >= events.buffer.len());
        }
        let batch = events.release().unwrap();
        assert_eq!(text(&batch.bytes), stream);
    }

    #[test]
    fn a_client_with_its_own_cursor_gets_its_own_control_events() {
        let stream = format!("{}{}{}{CLOSING}", data("a"), control(P1), data("b"));
        let mut events = Events::default();
        events.push(stream.as_bytes());
        let batch = events.release().unwrap();
        let mut frames = VecDeque::new();
        let mut n = 0;
        batch.render(
            || {
                n += 1;
                format!("90{n}")
            },
            &mut frames,
        );
        let rendered: String = frames.iter().map(|f| text(f)).collect();
        let own = String::from_utf8(control_event(P1, "901", true).to_vec()).unwrap();
        assert_eq!(
            rendered,
            format!("{}{own}{}{CLOSING}", data("a"), data("b"))
        );
        // The data is shared with the node's bytes, not copied.
        assert_eq!(frames[0].as_ptr(), batch.bytes.as_ptr());
    }

    #[test]
    fn control_events_are_written_as_the_node_writes_them() {
        let event = text(&control_event(P1, "1234", true));
        let json = event
            .strip_prefix("event: control\ndata:")
            .and_then(|t| t.strip_suffix("\n\n"))
            .unwrap();
        let value: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"streamNextOffset": P1, "streamCursor": "1234", "upToDate": true})
        );
        assert!(!text(&control_event(P1, "1", false)).contains("upToDate"));
    }
}
