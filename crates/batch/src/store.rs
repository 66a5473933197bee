//! Durable state under `--data-dir`: SQLite (WAL) for file records, batch objects
//! (each with its [`Owner`]) and per-line results, and `files/` for the files' bytes.
//!
//! Every lookup a client can reach takes the caller's owner and matches it in
//! SQL (`owner IS ?`): another owner's object is "no such object". A row whose
//! JSON does not decode is skipped (and logged) by the listings.
//!
//! Invariants: a line's result is one row keyed by (batch, line), inserted at
//! most once (`INSERT OR IGNORE`), and a batch's counters change in the same
//! transaction as the row, so after any crash the counters equal the rows and no
//! line is counted or written twice.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};

use crate::error::{Error, Result};
use crate::owner::Owner;
use crate::types::{BatchObject, BatchStatus, FileObject, OutputLine};

/// The accounting of one finished line.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LineUsage {
    pub input_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub machine_secs: f64,
}

pub struct Store {
    conn: Mutex<Connection>,
    files_dir: PathBuf,
}

impl Store {
    /// Opens (creating if absent) the store under `data_dir`.
    pub fn open(data_dir: &Path) -> Result<Store> {
        let files_dir = data_dir.join("files");
        std::fs::create_dir_all(&files_dir)
            .map_err(|e| Error::Storage(format!("cannot create {}: {e}", files_dir.display())))?;
        let conn = crate::schema::open(&data_dir.join("batches.sqlite3"))?;
        Ok(Store {
            conn: Mutex::new(conn),
            files_dir,
        })
    }

    fn db(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves SQLite consistent (transactions roll back).
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where a file's bytes live.
    pub fn file_path(&self, id: &str) -> PathBuf {
        self.files_dir.join(id)
    }

    /// Records a file made by `owner`.
    pub fn insert_file(&self, f: &FileObject, owner: &Owner) -> Result<()> {
        self.insert_file_within(f, owner, None)
    }

    /// Records a file made by `owner` unless the bytes of the files `owner` holds
    /// would then exceed `quota` (checked and inserted under one lock).
    pub fn insert_file_within(
        &self,
        f: &FileObject,
        owner: &Owner,
        quota: Option<u64>,
    ) -> Result<()> {
        let db = self.db();
        if let Some(quota) = quota {
            let held = held_bytes(&db, owner)?;
            if held.saturating_add(f.bytes) > quota {
                return Err(Error::QuotaExceeded { quota, held });
            }
        }
        db.execute(
            "INSERT INTO files (id, json, owner) VALUES (?1, ?2, ?3)",
            params![f.id, serde_json::to_string(f)?, owner.id()],
        )?;
        Ok(())
    }

    /// Bytes of the files `owner` holds (uploads and batch outputs).
    pub fn held_bytes(&self, owner: &Owner) -> Result<u64> {
        held_bytes(&self.db(), owner)
    }

    /// File `id` if `owner` made it.
    pub fn get_file(&self, id: &str, owner: &Owner) -> Result<Option<FileObject>> {
        let json: Option<String> = self
            .db()
            .query_row(
                "SELECT json FROM files WHERE id = ?1 AND owner IS ?2",
                params![id, owner.id()],
                |r| r.get(0),
            )
            .optional()?;
        Ok(json.map(|j| serde_json::from_str(&j)).transpose()?)
    }

    /// `owner`'s files newest first (or oldest first with `asc`), after the cursor `after`.
    pub fn list_files(
        &self,
        owner: &Owner,
        purpose: Option<&str>,
        after: Option<&str>,
        limit: usize,
        asc: bool,
    ) -> Result<(Vec<FileObject>, bool)> {
        let db = self.db();
        let cursor = cursor_seq(&db, "files", owner, after)?;
        let (cmp, order) = if asc { (">", "ASC") } else { ("<", "DESC") };
        let sql = format!(
            "SELECT id, json FROM files WHERE owner IS ?2 AND (?1 IS NULL OR seq {cmp} ?1)
             ORDER BY seq {order}"
        );
        let mut stmt = db.prepare(&sql)?;
        let mut rows = stmt.query(params![cursor, owner.id()])?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let Some(f) =
                decode::<FileObject>("file", &row.get::<_, String>(0)?, &row.get::<_, String>(1)?)
            else {
                continue;
            };
            if purpose.is_some_and(|p| p != f.purpose) {
                continue;
            }
            if out.len() == limit {
                return Ok((out, true));
            }
            out.push(f);
        }
        Ok((out, false))
    }

    /// Every file that decodes, of every owner, oldest first (retention).
    fn all_files(&self) -> Result<Vec<FileObject>> {
        let db = self.db();
        let mut stmt = db.prepare("SELECT id, json FROM files ORDER BY seq")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        let mut out = Vec::new();
        for row in rows {
            let (id, json) = row?;
            out.extend(decode("file", &id, &json));
        }
        Ok(out)
    }

    /// Removes the record and the bytes; false if there was no such file.
    pub fn delete_file(&self, id: &str) -> Result<bool> {
        let n = self.db().execute("DELETE FROM files WHERE id = ?1", [id])?;
        if n > 0 {
            match std::fs::remove_file(self.file_path(id)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(n > 0)
    }

    /// Records a batch made by `owner`.
    pub fn insert_batch(&self, b: &BatchObject, owner: &Owner) -> Result<()> {
        self.db().execute(
            "INSERT INTO batches (id, status, created_at, json, owner) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                b.id,
                b.status.as_str(),
                b.created_at as i64,
                serde_json::to_string(b)?,
                owner.id()
            ],
        )?;
        Ok(())
    }

    /// Batch `id` if `owner` made it.
    pub fn get_batch(&self, id: &str, owner: &Owner) -> Result<Option<BatchObject>> {
        let db = self.db();
        match batch_owner(&db, id)? {
            Some(o) if &o == owner => read_batch(&db, id),
            _ => Ok(None),
        }
    }

    /// Batch `id` and its owner, whoever that is (the job that runs it).
    pub fn batch(&self, id: &str) -> Result<Option<(BatchObject, Owner)>> {
        let db = self.db();
        let Some(owner) = batch_owner(&db, id)? else {
            return Ok(None);
        };
        Ok(read_batch(&db, id)?.map(|b| (b, owner)))
    }

    /// Applies `f` to the stored batch in one transaction; returns the result.
    pub fn update_batch(&self, id: &str, f: impl FnOnce(&mut BatchObject)) -> Result<BatchObject> {
        let mut db = self.db();
        let tx = db.transaction()?;
        let mut b = read_batch(&tx, id)?.ok_or_else(|| Error::NotFound {
            kind: "batch",
            id: id.into(),
        })?;
        f(&mut b);
        tx.execute(
            "UPDATE batches SET status = ?2, json = ?3 WHERE id = ?1",
            params![id, b.status.as_str(), serde_json::to_string(&b)?],
        )?;
        tx.commit()?;
        Ok(b)
    }

    /// `owner`'s batches newest first, after the cursor `after`.
    pub fn list_batches(
        &self,
        owner: &Owner,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<BatchObject>, bool)> {
        let db = self.db();
        let cursor = cursor_seq(&db, "batches", owner, after)?;
        let mut stmt = db.prepare(
            "SELECT id FROM batches WHERE owner IS ?2 AND (?1 IS NULL OR seq < ?1) ORDER BY seq DESC",
        )?;
        let mut rows = stmt.query(params![cursor, owner.id()])?;
        let mut out = Vec::with_capacity(limit.min(100));
        while let Some(row) = rows.next()? {
            let id: String = row.get(0)?;
            let b = match read_batch(&db, &id) {
                Ok(Some(b)) => b,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(batch = %id, error = %e, "skipping a batch row that does not decode");
                    continue;
                }
            };
            if out.len() == limit {
                return Ok((out, true));
            }
            out.push(b);
        }
        Ok((out, false))
    }

    /// Ids of the batches in one of `statuses`, oldest first.
    pub fn batches_in(&self, statuses: &[BatchStatus]) -> Result<Vec<String>> {
        let db = self.db();
        let mut stmt = db.prepare("SELECT id, status FROM batches ORDER BY seq ASC")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        let mut out = Vec::new();
        for row in rows {
            let (id, status) = row?;
            if statuses.iter().any(|s| s.as_str() == status) {
                out.push(id);
            }
        }
        Ok(out)
    }

    /// Count of batches per status.
    pub fn batch_status_counts(&self) -> Result<Vec<(String, u64)>> {
        let db = self.db();
        let mut stmt = db.prepare("SELECT status, COUNT(*) FROM batches GROUP BY status")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Bytes `batch`'s results take in its output and error files (each line and
    /// its newline).
    pub fn result_bytes(&self, batch: &str) -> Result<u64> {
        let n: i64 = self.db().query_row(
            "SELECT COALESCE(SUM(LENGTH(CAST(json AS BLOB)) + 1), 0) FROM results WHERE batch_id = ?1",
            [batch],
            |r| r.get(0),
        )?;
        Ok(n as u64)
    }

    /// Line numbers of `batch` that already have a result.
    pub fn done_lines(&self, batch: &str) -> Result<HashSet<u64>> {
        let db = self.db();
        let mut stmt = db.prepare("SELECT line FROM results WHERE batch_id = ?1")?;
        let rows = stmt.query_map([batch], |r| r.get::<_, i64>(0))?;
        Ok(rows
            .map(|r| r.map(|l| l as u64))
            .collect::<rusqlite::Result<_>>()?)
    }

    /// Records line `line`'s result once; false if it already had one.
    pub fn commit_result(
        &self,
        batch: &str,
        line: u64,
        out: &OutputLine,
        u: LineUsage,
    ) -> Result<bool> {
        let ok = out.is_success();
        let mut db = self.db();
        let tx = db.transaction()?;
        let n = tx.execute(
            "INSERT OR IGNORE INTO results (batch_id, line, ok, json) VALUES (?1, ?2, ?3, ?4)",
            params![batch, line as i64, ok, serde_json::to_string(out)?],
        )?;
        if n == 1 {
            tx.execute(
                "UPDATE batches SET completed = completed + ?2, failed = failed + ?3,
                 input_tokens = input_tokens + ?4, cached_tokens = cached_tokens + ?5,
                 output_tokens = output_tokens + ?6, machine_secs = machine_secs + ?7 WHERE id = ?1",
                params![
                    batch,
                    ok as i64,
                    !ok as i64,
                    u.input_tokens as i64,
                    u.cached_tokens as i64,
                    u.output_tokens as i64,
                    u.machine_secs
                ],
            )?;
        }
        tx.commit()?;
        Ok(n == 1)
    }

    /// Calls `f(ok, json)` for every result of `batch` in line order.
    pub fn for_each_result(
        &self,
        batch: &str,
        mut f: impl FnMut(bool, &str) -> Result<()>,
    ) -> Result<()> {
        let db = self.db();
        let mut stmt =
            db.prepare("SELECT ok, json FROM results WHERE batch_id = ?1 ORDER BY line")?;
        let mut rows = stmt.query([batch])?;
        while let Some(row) = rows.next()? {
            f(row.get(0)?, &row.get::<_, String>(1)?)?;
        }
        Ok(())
    }

    /// Deletes terminal batches created before `cutoff` (with their results) and
    /// files created before it that no live batch uses; returns (batches, files).
    pub fn delete_older_than(&self, cutoff: u64) -> Result<(usize, usize)> {
        let terminal: Vec<&str> = BatchStatus::ALL
            .iter()
            .filter(|s| s.is_terminal())
            .map(|s| s.as_str())
            .collect();
        let old_batches: Vec<String> = {
            let db = self.db();
            let mut stmt = db.prepare("SELECT id, status FROM batches WHERE created_at < ?1")?;
            let rows = stmt.query_map([cutoff as i64], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
            })?;
            rows.filter_map(|r| r.ok())
                .filter(|(_, s)| terminal.contains(&s.as_str()))
                .map(|(id, _)| id)
                .collect()
        };
        for id in &old_batches {
            let mut db = self.db();
            let tx = db.transaction()?;
            tx.execute("DELETE FROM results WHERE batch_id = ?1", [id])?;
            tx.execute("DELETE FROM batches WHERE id = ?1", [id])?;
            tx.commit()?;
        }
        let live_inputs: HashSet<String> = {
            let db = self.db();
            let mut stmt = db.prepare("SELECT json FROM batches")?;
            let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
            rows.filter_map(|r| r.ok())
                .filter_map(|j| serde_json::from_str::<BatchObject>(&j).ok())
                .filter(|b| !b.status.is_terminal())
                .map(|b| b.input_file_id)
                .collect()
        };
        let old_files = self.all_files()?;
        let mut files = 0;
        for f in old_files
            .iter()
            .filter(|f| f.created_at < cutoff && !live_inputs.contains(&f.id))
        {
            files += self.delete_file(&f.id)? as usize;
        }
        Ok((old_batches.len(), files))
    }
}

/// Decodes a row's JSON; a row that does not decode is logged and skipped.
fn decode<T: serde::de::DeserializeOwned>(kind: &str, id: &str, json: &str) -> Option<T> {
    match serde_json::from_str(json) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(kind, id, error = %e, "skipping a stored row that does not decode");
            None
        }
    }
}

fn held_bytes(db: &Connection, owner: &Owner) -> Result<u64> {
    let n: i64 = db.query_row(
        "SELECT COALESCE(SUM(CASE WHEN json_valid(json) THEN json_extract(json, '$.bytes') END), 0)
         FROM files WHERE owner IS ?1",
        [owner.id()],
        |r| r.get(0),
    )?;
    Ok(n.max(0) as u64)
}

/// The owner of batch `id` (`None`: no such batch).
fn batch_owner(db: &Connection, id: &str) -> Result<Option<Owner>> {
    let row: Option<Option<String>> = db
        .query_row("SELECT owner FROM batches WHERE id = ?1", [id], |r| {
            r.get(0)
        })
        .optional()?;
    Ok(row.map(|o| o.map_or(Owner::NONE, Owner::key)))
}

/// The position of `owner`'s object `after` (another owner's id is "no such id").
fn cursor_seq(
    db: &Connection,
    table: &str,
    owner: &Owner,
    after: Option<&str>,
) -> Result<Option<i64>> {
    let Some(after) = after else { return Ok(None) };
    let seq = db
        .query_row(
            &format!("SELECT seq FROM {table} WHERE id = ?1 AND owner IS ?2"),
            params![after, owner.id()],
            |r| r.get(0),
        )
        .optional()?;
    seq.map(Some)
        .ok_or_else(|| Error::invalid("after", format!("after: no such id {after:?}")))
}

fn read_batch(db: &Connection, id: &str) -> Result<Option<BatchObject>> {
    let row = db
        .query_row(
            "SELECT json, completed, failed, input_tokens, cached_tokens, output_tokens, machine_secs
             FROM batches WHERE id = ?1",
            [id],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    [r.get::<_, i64>(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?],
                    r.get::<_, f64>(6)?,
                ))
            },
        )
        .optional()?;
    let Some((json, [completed, failed, input, cached, output], secs)) = row else {
        return Ok(None);
    };
    let mut b: BatchObject = serde_json::from_str(&json)?;
    b.request_counts.completed = completed as u64;
    b.request_counts.failed = failed as u64;
    b.usage.input_tokens = input as u64;
    b.usage.input_tokens_details.cached_tokens = cached as u64;
    b.usage.output_tokens = output as u64;
    b.usage.total_tokens = (input + output) as u64;
    b.sloserve.machine_seconds = secs;
    Ok(Some(b))
}
