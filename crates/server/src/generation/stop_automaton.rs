//! [`StopAutomaton`]: the request's stop strings as one Aho-Corasick automaton over
//! bytes, so matching costs the new text plus at most the longest stop string per
//! piece, however many stop strings there are. Built once per request (its choices
//! share it); a state is the longest suffix of the text seen that begins a stop.

/// One trie node: its edges in `StopAutomaton::edges`, its failure link, the length
/// of the text it stands for, and the longest stop string ending here (0: none).
#[derive(Debug, Clone, Copy)]
struct Node {
    edges_from: u32,
    edges_len: u16,
    fail: u32,
    depth: u32,
    out: u32,
}

/// The automaton of a set of non-empty stop strings.
#[derive(Debug)]
pub struct StopAutomaton {
    nodes: Vec<Node>,
    /// Each node's edges, sorted by byte, one run per node.
    edges: Vec<(u8, u32)>,
    longest: usize,
}

/// The root: nothing of any stop string seen.
pub const ROOT: u32 = 0;

impl StopAutomaton {
    /// `None` when there are no stop strings. Empty strings are ignored (the API
    /// refuses them).
    pub fn new<S: AsRef<str>>(stops: &[S]) -> Option<Self> {
        let stops: Vec<&[u8]> = stops
            .iter()
            .map(|s| s.as_ref().as_bytes())
            .filter(|s| !s.is_empty())
            .collect();
        if stops.is_empty() {
            return None;
        }
        // The trie, edges per node sorted by byte.
        let mut children: Vec<Vec<(u8, u32)>> = vec![Vec::new()];
        let mut depth = vec![0u32];
        let mut end = vec![false];
        for s in &stops {
            let mut at = 0usize;
            for &b in *s {
                at = match children[at].binary_search_by_key(&b, |e| e.0) {
                    Ok(i) => children[at][i].1 as usize,
                    Err(i) => {
                        let next = children.len();
                        children[at].insert(i, (b, next as u32));
                        children.push(Vec::new());
                        depth.push(depth[at] + 1);
                        end.push(false);
                        next
                    }
                };
            }
            end[at] = true;
        }
        let child = |at: usize, b: u8| -> Option<u32> {
            let c = &children[at];
            c.binary_search_by_key(&b, |e| e.0).ok().map(|i| c[i].1)
        };
        // Failure links and outputs, breadth first (a node's links are shorter).
        let n = children.len();
        let mut fail = vec![0u32; n];
        let mut out = vec![0u32; n];
        let mut queue = std::collections::VecDeque::from([0usize]);
        while let Some(u) = queue.pop_front() {
            for &(b, v) in &children[u] {
                let v = v as usize;
                if u != 0 {
                    let mut f = fail[u] as usize;
                    fail[v] = loop {
                        if let Some(t) = child(f, b) {
                            break t;
                        }
                        if f == 0 {
                            break 0;
                        }
                        f = fail[f] as usize;
                    };
                }
                out[v] = if end[v] {
                    depth[v]
                } else {
                    out[fail[v] as usize]
                };
                queue.push_back(v);
            }
        }
        let mut nodes = Vec::with_capacity(n);
        let mut edges = Vec::with_capacity(n.saturating_sub(1));
        for (i, c) in children.iter().enumerate() {
            nodes.push(Node {
                edges_from: edges.len() as u32,
                edges_len: c.len() as u16,
                fail: fail[i],
                depth: depth[i],
                out: out[i],
            });
            edges.extend_from_slice(c);
        }
        let longest = stops.iter().map(|s| s.len()).max().unwrap_or(0);
        Some(StopAutomaton {
            nodes,
            edges,
            longest,
        })
    }

    /// The longest stop string's length in bytes.
    pub fn longest(&self) -> usize {
        self.longest
    }

    /// The state after `b` (amortized constant: failure links only shorten).
    #[inline]
    pub fn next(&self, mut state: u32, b: u8) -> u32 {
        loop {
            let n = &self.nodes[state as usize];
            let from = n.edges_from as usize;
            let run = &self.edges[from..from + n.edges_len as usize];
            if let Ok(i) = run.binary_search_by_key(&b, |e| e.0) {
                return run[i].1;
            }
            if state == ROOT {
                return ROOT;
            }
            state = n.fail;
        }
    }

    /// The length of the longest stop string that ends at `state` (0: none).
    #[inline]
    pub fn matched(&self, state: u32) -> usize {
        self.nodes[state as usize].out as usize
    }

    /// How many of the last bytes seen could begin a stop string.
    #[inline]
    pub fn depth(&self, state: u32) -> usize {
        self.nodes[state as usize].depth as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walk(a: &StopAutomaton, text: &str) -> (u32, Vec<(usize, usize)>) {
        let mut s = ROOT;
        let mut hits = Vec::new();
        for (i, b) in text.bytes().enumerate() {
            s = a.next(s, b);
            if a.matched(s) > 0 {
                hits.push((i + 1 - a.matched(s), i + 1));
            }
        }
        (s, hits)
    }

    #[test]
    fn matches_suffixes_and_depth() {
        let a = StopAutomaton::new(&["abcd", "bc", "c"]).unwrap();
        let (s, hits) = walk(&a, "xabcd");
        // "bc" ends at 4 (longest ending there), "abcd" at 5.
        assert_eq!(hits, vec![(2, 4), (1, 5)]);
        assert_eq!(a.depth(s), 4);
        let (s, _) = walk(&a, "xxab");
        assert_eq!(a.depth(s), 2);
        let (s, _) = walk(&a, "abx");
        assert_eq!(a.depth(s), 0);
        assert_eq!(a.longest(), 4);
        assert!(StopAutomaton::new::<&str>(&[]).is_none());
    }
}
