//! Plot checks shared by the bench tests: a PNG that decodes and is not blank, an SVG that parses.

use std::path::Path;

/// `DIR/STEM.png` and `DIR/STEM.svg` are valid plots.
pub fn check_plot(dir: &Path, stem: &str) {
    check_png(&dir.join(format!("{stem}.png")));
    check_svg(&dir.join(format!("{stem}.svg")));
}

/// PNG magic, then a full decode with sane dimensions.
pub fn check_png(path: &Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        &bytes[..8],
        b"\x89PNG\r\n\x1a\n",
        "{} is not a PNG",
        path.display()
    );
    let mut reader = png::Decoder::new(std::io::Cursor::new(&bytes))
        .read_info()
        .expect("PNG header");
    let (w, h) = (reader.info().width, reader.info().height);
    assert!(w >= 300 && h >= 200, "{}: {w}x{h}", path.display());
    let mut buf = vec![0; reader.output_buffer_size().expect("buffer size")];
    reader.next_frame(&mut buf).expect("PNG decodes");
    // Not blank: the plot has both white background and dark ink (axes, text).
    assert!(
        buf.contains(&255) && buf.iter().any(|&b| b < 64),
        "{} looks blank",
        path.display()
    );
}

/// Parses as XML with an `<svg>` root that has text in it.
pub fn check_svg(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc = roxmltree::Document::parse(&text)
        .unwrap_or_else(|e| panic!("{} is not XML: {e}", path.display()));
    assert_eq!(
        doc.root_element().tag_name().name(),
        "svg",
        "{}",
        path.display()
    );
    assert!(
        doc.descendants().any(|n| n.has_tag_name("text")),
        "{} has no text",
        path.display()
    );
}
