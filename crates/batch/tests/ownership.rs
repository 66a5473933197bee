//! Ownership in the Batch API's store and service: a schema-0 data dir migrates
//! with its objects owned by no key, every lookup and listing sees only its
//! owner's objects, a job runs its lines as its owner, a bad row is skipped by
//! the listings, a damaged database is refused at open, and the per-owner quota.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use rusqlite::Connection;
use serde_json::{json, Value};
use sloserve_batch::store::Store;
use sloserve_batch::types::*;
use sloserve_batch::{unix_now, BatchConfig, BatchService, Dispatch, Error, Owner, Reply};

fn file(id: &str, bytes: u64) -> FileObject {
    FileObject {
        id: id.into(),
        object: "file".into(),
        bytes,
        created_at: unix_now(),
        expires_at: None,
        filename: "in.jsonl".into(),
        purpose: "batch".into(),
        status: "processed".into(),
        status_details: None,
    }
}

fn ids<T>(v: &[T], id: impl Fn(&T) -> &str) -> Vec<String> {
    v.iter().map(|x| id(x).to_string()).collect()
}

/// The tables as sloserve wrote them before owners (schema 0), with one file and one batch.
fn schema0(dir: &std::path::Path) {
    let c = Connection::open(dir.join("batches.sqlite3")).unwrap();
    c.execute_batch(
        "CREATE TABLE files (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, json TEXT NOT NULL);
         CREATE TABLE batches (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
           status TEXT NOT NULL, created_at INTEGER NOT NULL, json TEXT NOT NULL,
           completed INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0,
           input_tokens INTEGER NOT NULL DEFAULT 0, cached_tokens INTEGER NOT NULL DEFAULT 0,
           output_tokens INTEGER NOT NULL DEFAULT 0, machine_secs REAL NOT NULL DEFAULT 0);
         CREATE TABLE results (batch_id TEXT NOT NULL, line INTEGER NOT NULL, ok INTEGER NOT NULL,
           json TEXT NOT NULL, PRIMARY KEY (batch_id, line));",
    )
    .unwrap();
    let f = serde_json::to_string(&file("file-old", 10)).unwrap();
    c.execute("INSERT INTO files (id, json) VALUES ('file-old', ?1)", [f])
        .unwrap();
    let b = BatchObject {
        id: "batch_old".into(),
        object: "batch".into(),
        endpoint: "/v1/completions".into(),
        model: None,
        errors: None,
        input_file_id: "file-old".into(),
        completion_window: "24h".into(),
        status: BatchStatus::Completed,
        output_file_id: None,
        error_file_id: None,
        created_at: 1,
        in_progress_at: None,
        expires_at: None,
        finalizing_at: None,
        completed_at: None,
        failed_at: None,
        expired_at: None,
        cancelling_at: None,
        cancelled_at: None,
        request_counts: RequestCounts::default(),
        usage: BatchUsage::default(),
        metadata: None,
        sloserve: BatchProgress::default(),
    };
    let b = serde_json::to_value(&b).unwrap();
    c.execute(
        "INSERT INTO batches (id, status, created_at, json) VALUES ('batch_old', 'completed', 1, ?1)",
        [b.to_string()],
    )
    .unwrap();
}

#[test]
fn a_schema0_store_migrates_and_its_objects_belong_to_no_key() {
    let dir = tempfile::tempdir().unwrap();
    schema0(dir.path());
    let store = Store::open(dir.path()).unwrap();
    let (a, none) = (Owner::key("a"), Owner::NONE);
    assert!(store.get_file("file-old", &none).unwrap().is_some());
    assert!(store.get_batch("batch_old", &none).unwrap().is_some());
    assert!(store.get_file("file-old", &a).unwrap().is_none());
    assert!(store.get_batch("batch_old", &a).unwrap().is_none());
    assert!(store
        .list_files(&a, None, None, 10, false)
        .unwrap()
        .0
        .is_empty());
    assert!(store.list_batches(&a, None, 10).unwrap().0.is_empty());
    assert_eq!(store.list_batches(&none, None, 10).unwrap().0.len(), 1);
    // New objects carry their owner; reopening does not migrate again.
    store.insert_file(&file("file-a", 5), &a).unwrap();
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    assert!(store.get_file("file-a", &a).unwrap().is_some());
    assert!(store.get_file("file-a", &none).unwrap().is_none());
    let c = Connection::open(dir.path().join("batches.sqlite3")).unwrap();
    let v: i64 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, 1);
    // A store from a newer sloserve is refused, not rewritten.
    c.pragma_update(None, "user_version", 7).unwrap();
    drop((store, c));
    let e = Store::open(dir.path()).err().unwrap().to_string();
    assert!(
        e.contains("schema version 7") && e.contains("batches.sqlite3"),
        "{e}"
    );
}

#[test]
fn each_owner_sees_only_its_own_objects() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let (a, b) = (Owner::key("a"), Owner::key("b"));
    for (id, o) in [("fa1", &a), ("fb1", &b), ("fa2", &a)] {
        store.insert_file(&file(id, 100), o).unwrap();
    }
    let files = |o: &Owner, after: Option<&str>| {
        let (v, more) = store.list_files(o, None, after, 10, true).unwrap();
        (ids(&v, |f| &f.id), more)
    };
    assert_eq!(files(&a, None), (vec!["fa1".into(), "fa2".into()], false));
    assert_eq!(files(&b, None), (vec!["fb1".to_string()], false));
    assert!(files(&Owner::NONE, None).0.is_empty());
    assert!(store.get_file("fa1", &b).unwrap().is_none());
    // Another owner's id is no cursor (its existence is not confirmed).
    assert!(store.list_files(&b, None, Some("fa1"), 10, true).is_err());
    assert_eq!(files(&a, Some("fa1")).0, ["fa2"]);
    assert_eq!(store.held_bytes(&a).unwrap(), 200);
    // The quota counts only the owner's bytes, checked at insert.
    let e = store.insert_file_within(&file("fa3", 801), &a, Some(1000));
    assert!(matches!(
        e,
        Err(Error::QuotaExceeded {
            quota: 1000,
            held: 200
        })
    ));
    assert_eq!(e.unwrap_err().to_api().status, 413);
    store
        .insert_file_within(&file("fa3", 800), &a, Some(1000))
        .unwrap();
    store
        .insert_file_within(&file("fb2", 900), &b, Some(1000))
        .unwrap();
}

#[test]
fn listings_skip_a_row_that_does_not_decode() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let a = Owner::key("a");
    store.insert_file(&file("f1", 1), &a).unwrap();
    store.insert_file(&file("f2", 1), &a).unwrap();
    let c = Connection::open(dir.path().join("batches.sqlite3")).unwrap();
    c.execute("UPDATE files SET json = '{not json' WHERE id = 'f1'", [])
        .unwrap();
    c.execute(
        "INSERT INTO batches (id, status, created_at, json, owner) VALUES ('bad', 'completed', 1, '[', 'a')",
        [],
    )
    .unwrap();
    let (v, _) = store.list_files(&a, None, None, 10, false).unwrap();
    assert_eq!(ids(&v, |f| &f.id), ["f2"]);
    assert!(store.list_batches(&a, None, 10).unwrap().0.is_empty());
    assert_eq!(store.held_bytes(&a).unwrap(), 1);
}

#[test]
fn a_damaged_database_is_refused_at_open_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("batches.sqlite3");
    std::fs::write(&db, vec![b'x'; 8192]).unwrap();
    let e = Store::open(dir.path()).err().unwrap().to_string();
    assert!(e.contains(&db.display().to_string()), "{e}");
    // A real database with a page overwritten fails the integrity check.
    std::fs::remove_file(&db).unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        for i in 0..400 {
            store
                .insert_file(&file(&format!("file-{i:04}"), i), &Owner::key("a"))
                .unwrap();
        }
    }
    let mut bytes = std::fs::read(&db).unwrap();
    assert!(bytes.len() > 8 * 4096, "{}", bytes.len());
    bytes[3 * 4096..6 * 4096].fill(0xA5);
    std::fs::write(&db, bytes).unwrap();
    let e = Store::open(dir.path()).err().unwrap().to_string();
    assert!(e.contains(&db.display().to_string()), "{e}");
    assert!(e.contains("integrity") || e.contains("malformed"), "{e}");
}

/// Records the owner of every line it runs.
struct Owners(Arc<Mutex<Vec<Owner>>>);

impl Dispatch for Owners {
    fn call<'a>(&'a self, owner: &'a Owner, _url: &'a str, _body: Value) -> BoxFuture<'a, Reply> {
        self.0.lock().unwrap().push(owner.clone());
        Box::pin(async {
            Reply {
                status: 200,
                body: json!({"id": "cmpl-1", "usage": {"prompt_tokens": 1, "completion_tokens": 1}}),
                retry_after: None,
            }
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_runs_as_its_owner_and_only_its_owner_reaches_it() {
    let dir = tempfile::tempdir().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let cfg = BatchConfig {
        data_dir: dir.path().into(),
        max_file_bytes: 1 << 20,
        quota_bytes_per_owner: None,
        max_lines: 100,
        max_line_bytes: 1 << 20,
        max_inflight: 2,
        retention: None,
        machine_cost_per_hour: None,
    };
    let svc = BatchService::open(cfg, Box::new(Owners(seen.clone()))).unwrap();
    svc.start().unwrap();
    let (a, b) = (Owner::key("a"), Owner::key("b"));
    let text: String = (0..3)
        .map(|i| {
            format!(
                "{}\n",
                json!({"custom_id": format!("c{i}"), "method": "POST", "url": "/v1/completions",
                "body": {"prompt": "p"}})
            )
        })
        .collect();
    std::fs::write(svc.files().file_path("file-a"), &text).unwrap();
    svc.files()
        .insert_file(&file("file-a", text.len() as u64), &a)
        .unwrap();
    let req = |f: &str| CreateBatch {
        input_file_id: f.into(),
        endpoint: "/v1/completions".into(),
        completion_window: "24h".into(),
        metadata: None,
        output_expires_after: None,
    };
    let not_found = |r: Result<BatchObject, Error>| matches!(r, Err(Error::NotFound { .. }));
    // B cannot start a batch on A's file.
    assert!(not_found(svc.create_batch(req("file-a"), &b)));
    let id = svc.create_batch(req("file-a"), &a).unwrap().id;
    assert!(not_found(svc.get_batch(&id, &b)));
    assert!(not_found(svc.cancel_batch(&id, &b)));
    assert!(svc.list_batches(&b, None, 10).unwrap().data.is_empty());
    let done = loop {
        let got = svc.get_batch(&id, &a).unwrap();
        if got.status.is_terminal() {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(done.status, BatchStatus::Completed);
    assert_eq!(*seen.lock().unwrap(), vec![a.clone(); 3]);
    // The output file is A's too.
    let out = done.output_file_id.unwrap();
    assert!(svc.files().get_file(&out, &a).unwrap().is_some());
    assert!(svc.files().get_file(&out, &b).unwrap().is_none());
}
