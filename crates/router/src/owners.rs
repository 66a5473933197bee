//! Which replica owns a batch or file id (the Batch API keeps them per replica):
//! learned from answers' bodies, bounded, oldest forgotten first.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::backend::Backend;

/// Ids remembered at most.
const CAPACITY: usize = 100_000;

#[derive(Default)]
pub struct Owners {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    map: HashMap<String, Arc<Backend>>,
    order: VecDeque<String>,
}

/// Fields of Batch API objects that name ids living on the same replica.
const ID_FIELDS: [&str; 4] = ["id", "input_file_id", "output_file_id", "error_file_id"];

impl Owners {
    pub fn get(&self, id: &str) -> Option<Arc<Backend>> {
        self.inner.lock().unwrap().map.get(id).cloned()
    }

    pub fn insert(&self, id: &str, backend: &Arc<Backend>) {
        let mut g = self.inner.lock().unwrap();
        if g.map.insert(id.to_owned(), backend.clone()).is_none() {
            g.order.push_back(id.to_owned());
            while g.order.len() > CAPACITY {
                if let Some(old) = g.order.pop_front() {
                    g.map.remove(&old);
                }
            }
        }
    }

    /// Records every id in a Batch API answer (one object or a list) as `backend`'s.
    pub fn learn(&self, body: &Value, backend: &Arc<Backend>) {
        let objects: Vec<&Value> = match body.get("data").and_then(Value::as_array) {
            Some(list) => list.iter().collect(),
            None => vec![body],
        };
        for o in objects {
            for f in ID_FIELDS {
                if let Some(id) = o.get(f).and_then(Value::as_str) {
                    self.insert(id, backend);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Fleet;
    use crate::config::FleetConfig;

    #[test]
    fn learns_ids_from_objects_and_lists() {
        let f = Fleet::new(&FleetConfig {
            name: "batch".into(),
            urls: vec!["http://a:1".into(), "http://b:2".into()],
        });
        let o = Owners::default();
        o.learn(
            &serde_json::json!({"id": "batch_1", "input_file_id": "file-in", "output_file_id": null}),
            &f.backends[0],
        );
        o.learn(
            &serde_json::json!({"object": "list", "data": [{"id": "file-2"}]}),
            &f.backends[1],
        );
        assert!(Arc::ptr_eq(&o.get("batch_1").unwrap(), &f.backends[0]));
        assert!(Arc::ptr_eq(&o.get("file-in").unwrap(), &f.backends[0]));
        assert!(Arc::ptr_eq(&o.get("file-2").unwrap(), &f.backends[1]));
        assert!(o.get("list").is_none() && o.get("nope").is_none());
    }
}
