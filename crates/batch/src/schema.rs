//! The store's SQLite schema: opening a database file, the integrity check at
//! open, and the migrations between schema versions (`PRAGMA user_version`).
//!
//! Version 0 (before owners) had no `owner` column; version 1 adds it. Rows
//! from version 0 get `owner` NULL: they belong to no key, so they stay visible
//! on a server without API keys (as before) and to no key on a server with keys
//! (nobody can prove they made them; see docs/security.md).

use std::path::Path;

use rusqlite::Connection;

use crate::error::{Error, Result};

/// The schema this build writes.
pub const VERSION: i64 = 1;

const TABLES: &str = "
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    json TEXT NOT NULL,
    owner TEXT
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
    machine_secs REAL NOT NULL DEFAULT 0,
    owner TEXT
);
CREATE TABLE IF NOT EXISTS results (
    batch_id TEXT NOT NULL,
    line INTEGER NOT NULL,
    ok INTEGER NOT NULL,
    json TEXT NOT NULL,
    PRIMARY KEY (batch_id, line)
);
";

const INDEXES: &str = "
CREATE INDEX IF NOT EXISTS files_by_owner ON files (owner, seq);
CREATE INDEX IF NOT EXISTS batches_by_owner ON batches (owner, seq);
";

/// Opens `db` (created if absent), checks it and brings it to [`VERSION`]; every
/// error names the file.
pub fn open(db: &Path) -> Result<Connection> {
    let named = |e: Error| match e {
        Error::Storage(m) => Error::Storage(format!("{}: {m}", db.display())),
        e => e,
    };
    let conn = Connection::open(db).map_err(|e| named(e.into()))?;
    setup(&conn).map_err(named)?;
    Ok(conn)
}

fn setup(conn: &Connection) -> Result<()> {
    // WAL + NORMAL: a committed transaction survives the process being killed.
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    check_integrity(conn)?;
    migrate(conn)
}

/// `PRAGMA quick_check`: the b-trees and their pages are well formed.
fn check_integrity(conn: &Connection) -> Result<()> {
    let mut stmt = conn.prepare("PRAGMA quick_check(5)")?;
    let problems: Vec<String> = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<_>>()?;
    if problems.len() == 1 && problems[0] == "ok" {
        return Ok(());
    }
    Err(Error::Storage(format!(
        "the batch store failed SQLite's integrity check ({}); restore it from a \
         backup, or move it away to start with an empty store",
        problems.join("; ")
    )))
}

fn has_column(conn: &Connection, table: &str, column: &str) -> Result<bool> {
    let mut stmt = conn.prepare(&format!("PRAGMA table_info({table})"))?;
    let names: Vec<String> = stmt
        .query_map([], |r| r.get::<_, String>(1))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(names.iter().any(|n| n == column))
}

fn migrate(conn: &Connection) -> Result<()> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version > VERSION {
        return Err(Error::Storage(format!(
            "the batch store has schema version {version}, newer than this sloserve's \
             ({VERSION}); run a newer sloserve on it"
        )));
    }
    if version == VERSION {
        return Ok(());
    }
    let tx = conn.unchecked_transaction()?;
    tx.execute_batch(TABLES)?;
    let mut unowned = 0i64;
    for table in ["files", "batches"] {
        if !has_column(&tx, table, "owner")? {
            tx.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN owner TEXT"))?;
            unowned += tx.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| {
                r.get::<_, i64>(0)
            })?;
        }
    }
    tx.execute_batch(INDEXES)?;
    tx.pragma_update(None, "user_version", VERSION)?;
    tx.commit()?;
    if unowned > 0 {
        tracing::warn!(
            objects = unowned,
            "batch store migrated to schema {VERSION}: files and batches created before \
             owners were recorded belong to no API key (visible only on a server without keys)"
        );
    }
    Ok(())
}
