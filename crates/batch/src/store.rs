//! Durable state under `--data-dir`: SQLite (WAL) for file records, batch objects
//! and per-line results, and `files/` for the files' bytes.
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
use crate::types::{BatchObject, BatchStatus, FileObject, OutputLine};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    status TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    json TEXT NOT NULL,
    completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    machine_secs REAL NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS results (
    batch_id TEXT NOT NULL,
    line INTEGER NOT NULL,
    ok INTEGER NOT NULL,
    json TEXT NOT NULL,
    PRIMARY KEY (batch_id, line)
);
";

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
        let db = data_dir.join("batches.sqlite3");
        let conn = Connection::open(&db)
            .map_err(|e| Error::Storage(format!("cannot open {}: {e}", db.display())))?;
        // WAL + NORMAL: a committed transaction survives the process being killed.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
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

    pub fn insert_file(&self, f: &FileObject) -> Result<()> {
        self.db().execute(
            "INSERT INTO files (id, json) VALUES (?1, ?2)",
            params![f.id, serde_json::to_string(f)?],
        )?;
        Ok(())
    }

    pub fn get_file(&self, id: &str) -> Result<Option<FileObject>> {
        let json: Option<String> = self
            .db()
            .query_row("SELECT json FROM files WHERE id = ?1", [id], |r| r.get(0))
            .optional()?;
        Ok(json.map(|j| serde_json::from_str(&j)).transpose()?)
    }

    /// Files newest first (or oldest first with `asc`), after the cursor `after`.
    pub fn list_files(
        &self,
        purpose: Option<&str>,
        after: Option<&str>,
        limit: usize,
        asc: bool,
    ) -> Result<(Vec<FileObject>, bool)> {
        let db = self.db();
        let cursor = cursor_seq(&db, "files", after)?;
        let (cmp, order) = if asc { (">", "ASC") } else { ("<", "DESC") };
        let sql = format!(
            "SELECT json FROM files WHERE (?1 IS NULL OR seq {cmp} ?1) ORDER BY seq {order}"
        );
        let mut stmt = db.prepare(&sql)?;
        let mut rows = stmt.query(params![cursor])?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let f: FileObject = serde_json::from_str(&row.get::<_, String>(0)?)?;
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

    pub fn insert_batch(&self, b: &BatchObject) -> Result<()> {
        self.db().execute(
            "INSERT INTO batches (id, status, created_at, json) VALUES (?1, ?2, ?3, ?4)",
            params![
                b.id,
                b.status.as_str(),
                b.created_at as i64,
                serde_json::to_string(b)?
            ],
        )?;
        Ok(())
    }

    pub fn get_batch(&self, id: &str) -> Result<Option<BatchObject>> {
        let db = self.db();
        read_batch(&db, id)
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

    /// Batches newest first, after the cursor `after`.
    pub fn list_batches(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<BatchObject>, bool)> {
        let db = self.db();
        let cursor = cursor_seq(&db, "batches", after)?;
        let ids: Vec<String> = db
            .prepare(
                "SELECT id FROM batches WHERE (?1 IS NULL OR seq < ?1) ORDER BY seq DESC LIMIT ?2",
            )?
            .query_map(params![cursor, limit as i64 + 1], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        let has_more = ids.len() > limit;
        let mut out = Vec::with_capacity(limit);
        for id in ids.iter().take(limit) {
            out.extend(read_batch(&db, id)?);
        }
        Ok((out, has_more))
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
        let (old_files, _) = self.list_files(None, None, usize::MAX, true)?;
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

fn cursor_seq(db: &Connection, table: &str, after: Option<&str>) -> Result<Option<i64>> {
    let Some(after) = after else { return Ok(None) };
    let seq = db
        .query_row(
            &format!("SELECT seq FROM {table} WHERE id = ?1"),
            [after],
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
