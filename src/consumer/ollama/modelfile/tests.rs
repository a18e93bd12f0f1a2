//! The Modelfile reader and updater, read back the way Ollama's parser reads.

use super::*;

const V: [(&str, Option<u32>); 3] = [("num_gpu", Some(0)), ("num_thread", Some(8)), ("num_ctx", Some(4096))];

/// The update as Ollama reads it: every command but the owned
/// parameters unchanged, the owned ones holding exactly `V`.
fn reads_back(old: &str, new: &str) {
    reads_back_as(old, new, &V);
}

fn reads_back_as(old: &str, new: &str, values: &[(&str, Option<u32>)]) {
    let strip = |s: &str| s.strip_prefix('\u{feff}').unwrap_or(s).to_string();
    let (o, n) = (parse(&strip(old)).unwrap(), parse(&strip(new)).unwrap());
    let others = |cs: &[Command]| -> Vec<(String, String)> {
        cs.iter()
            .filter(|c| !(c.parameter && OWNED.contains(&c.name.as_str())))
            .map(|c| (c.name.clone(), c.args.clone()))
            .collect()
    };
    assert_eq!(others(&o), others(&n), "{new}");
    let params = parameters(&n);
    for (k, v) in values {
        let got = params.iter().find(|(name, _)| name == k).map(|(_, v)| v.clone());
        assert_eq!(got, v.map(|v| vec![v.to_string()]), "{k} in {new}");
    }
    assert_eq!(update(new, values).unwrap(), new, "a second update changes nothing");
}

#[test]
fn num_gpu_left_to_ollama_removes_its_lines_and_nothing_else() {
    let unset = [("num_gpu", None), ("num_thread", Some(8)), ("num_ctx", Some(4096))];
    let old = "FROM x.gguf\r\nTEMPLATE \"\"\"\r\nPARAMETER num_gpu 1\r\n\"\"\"\r\nPARAMETER num_gpu 12\r\n  parameter num_gpu\t\"7\"\r\nPARAMETER num_ctx 2048\r\nPARAMETER num_gpu 3";
    let new = update(old, &unset).unwrap();
    assert_eq!(
        new,
        "FROM x.gguf\r\nTEMPLATE \"\"\"\r\nPARAMETER num_gpu 1\r\n\"\"\"\r\nPARAMETER num_ctx 4096\r\nPARAMETER num_thread 8\r\n"
    );
    reads_back_as(old, &new, &unset);
    let only = update("FROM x.gguf\nPARAMETER num_gpu 12\n", &unset).unwrap();
    assert_eq!(only, "FROM x.gguf\nPARAMETER num_thread 8\nPARAMETER num_ctx 4096\n");
}

fn up(old: &str) -> String {
    let new = update(old, &V).unwrap_or_else(|e| panic!("{e:?}: {old}"));
    reads_back(old, &new);
    new
}

fn refused(old: &str) -> ParseError {
    update(old, &V).expect_err(old)
}

#[test]
fn only_owned_values_change_and_blocks_are_not_instructions() {
    let old = "# my assistant\nFROM ./gemma.gguf\n\nTEMPLATE \"\"\"{{ .System }}\nPARAMETER num_gpu 1\n{{ .Prompt }}\"\"\"\nSYSTEM \"\"\"\nYou are terse.\n\"\"\"\nPARAMETER temperature 0.7\nparameter num_gpu\t12\nPARAMETER stop \"<end>\"\n# trailing comment";
    let want = "# my assistant\nFROM ./gemma.gguf\n\nTEMPLATE \"\"\"{{ .System }}\nPARAMETER num_gpu 1\n{{ .Prompt }}\"\"\"\nSYSTEM \"\"\"\nYou are terse.\n\"\"\"\nPARAMETER temperature 0.7\nparameter num_gpu\t0\nPARAMETER stop \"<end>\"\nPARAMETER num_thread 8\nPARAMETER num_ctx 4096\n# trailing comment";
    assert_eq!(up(old), want);
}

#[test]
fn a_multi_line_stop_block_is_never_split() {
    let old = "FROM x.gguf\nPARAMETER num_gpu 99\nPARAMETER stop \"\"\"\n<|im_end|>\n\"\"\"\n";
    assert_eq!(
        up(old),
        "FROM x.gguf\nPARAMETER num_gpu 0\nPARAMETER stop \"\"\"\n<|im_end|>\n\"\"\"\nPARAMETER num_thread 8\nPARAMETER num_ctx 4096\n"
    );
    // Ending the file inside its closing line.
    let old = "FROM x.gguf\nPARAMETER stop \"\"\"\n<|im_end|>\n\"\"\"";
    assert_eq!(
        up(old),
        "FROM x.gguf\nPARAMETER stop \"\"\"\n<|im_end|>\n\"\"\"\nPARAMETER num_gpu 0\nPARAMETER num_thread 8\nPARAMETER num_ctx 4096\n"
    );
}

#[test]
fn an_odd_triple_quote_in_a_comment_or_mid_value_opens_nothing() {
    let old = "FROM x.gguf\n# Use \"\"\" for multi-line values\nPARAMETER num_gpu 99\nSYSTEM say \"\"\" to quote\nPARAMETER num_ctx 2048\n";
    assert_eq!(
        up(old),
        "FROM x.gguf\n# Use \"\"\" for multi-line values\nPARAMETER num_gpu 0\nSYSTEM say \"\"\" to quote\nPARAMETER num_ctx 4096\nPARAMETER num_thread 8\n"
    );
}

#[test]
fn multi_line_plain_quoted_values_and_messages() {
    let old = "FROM x.gguf\nSYSTEM \"You are\nPARAMETER num_gpu 5\nterse\"\nMESSAGE user \"\"\"hi\nthere\"\"\"\nMESSAGE assistant hello\nPARAMETER num_gpu \"7\"\n";
    let new = up(old);
    assert_eq!(
        new,
        "FROM x.gguf\nSYSTEM \"You are\nPARAMETER num_gpu 5\nterse\"\nMESSAGE user \"\"\"hi\nthere\"\"\"\nMESSAGE assistant hello\nPARAMETER num_gpu 0\nPARAMETER num_thread 8\nPARAMETER num_ctx 4096\n"
    );
    let cmds = parse(&new).unwrap();
    assert_eq!(cmds[1].args, "You are\nPARAMETER num_gpu 5\nterse");
    assert_eq!(cmds[2].args, "user: hi\nthere");
}

#[test]
fn a_repeated_owned_parameter_gets_one_value_everywhere() {
    let old = "FROM x.gguf\nPARAMETER num_gpu 99\nPARAMETER num_thread 4\nPARAMETER num_gpu 12\n";
    assert_eq!(
        up(old),
        "FROM x.gguf\nPARAMETER num_gpu 0\nPARAMETER num_thread 8\nPARAMETER num_gpu 0\nPARAMETER num_ctx 4096\n"
    );
}

#[test]
fn crlf_bom_missing_newline_license_adapter_and_repeated_stop() {
    assert_eq!(
        up("FROM x.gguf\r\nPARAMETER num_ctx 2048\r\n"),
        "FROM x.gguf\r\nPARAMETER num_ctx 4096\r\nPARAMETER num_gpu 0\r\nPARAMETER num_thread 8\r\n"
    );
    assert_eq!(up("FROM x.gguf"), "FROM x.gguf\nPARAMETER num_gpu 0\nPARAMETER num_thread 8\nPARAMETER num_ctx 4096\n");
    assert_eq!(
        up("\u{feff}FROM x.gguf\nPARAMETER num_gpu 1\n"),
        "\u{feff}FROM x.gguf\nPARAMETER num_gpu 0\nPARAMETER num_thread 8\nPARAMETER num_ctx 4096\n"
    );
    let old = "FROM x.gguf\nADAPTER ./lora.gguf\nLICENSE \"\"\"\nPARAMETER num_gpu 3\n\"\"\"\nPARAMETER stop <a>\nPARAMETER stop <b>\n";
    let new = up(old);
    assert!(new.starts_with("FROM x.gguf\nADAPTER ./lora.gguf\nLICENSE \"\"\"\nPARAMETER num_gpu 3\n\"\"\"\nPARAMETER stop <a>\nPARAMETER stop <b>\nPARAMETER num_gpu 0\n"), "{new}");
    let stops = parameters(&parse(&new).unwrap()).into_iter().find(|(k, _)| k == "stop").unwrap().1;
    assert_eq!(stops, ["<a>", "<b>"]);
    // No PARAMETER at all: after the FROM.
    assert_eq!(
        up("# c\nFROM x.gguf\nSYSTEM hi\n"),
        "# c\nFROM x.gguf\nPARAMETER num_gpu 0\nPARAMETER num_thread 8\nPARAMETER num_ctx 4096\nSYSTEM hi\n"
    );
}

#[test]
fn what_ollama_rejects_is_refused_with_its_line() {
    for (old, line, needle) in [
        ("FROM x.gguf\nPARAMETER num_gpu\n", 2, "PARAMETER num_gpu has no value"),
        ("FROM x.gguf\nPARAMETER num_gpu \nPARAMETER num_ctx 1\n", 2, "PARAMETER num_gpu has no value"),
        ("FROM x.gguf\nSYSTEM \"\"\"never\nclosed\n", 2, "never closed"),
        ("FROM x.gguf\nPARAMETER NUM_GPU 12\n", 2, "case-sensitive"),
        ("FROM x.gguf\n\nPARAMETER num_gpu_layers 12\n", 3, "its name is num_gpu"),
        ("FROM x.gguf\nGPU 12\n", 2, "not a Modelfile command"),
        ("FROM x.gguf\nMESSAGE bot hi\n", 2, "role 'bot'"),
        ("# only a comment\n", 1, "no FROM line"),
        ("FROM x.gguf\nPARAMETER  num_gpu 12\n", 2, "more than one space"),
    ] {
        let e = refused(old);
        assert_eq!(e.line, line, "{old:?}: {e:?}");
        assert!(e.msg.contains(needle), "{old:?}: {e:?}");
    }
}

/// Cases from Ollama's own parser tests, as it reads them.
#[test]
fn reads_like_ollama() {
    let read = |s: &str| parse(s).unwrap().into_iter().map(|c| (c.name, c.args)).collect::<Vec<_>>();
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(read("FROM     FOOO BAR    "), [pair("model", "FOOO BAR")]);
    assert_eq!(read("FROM \"FOO  BAR  \""), [pair("model", "FOO  BAR  ")]);
    assert_eq!(
        read("PARAMETER what the \nFROM lemons make lemonade "),
        [pair("what", "the"), pair("model", "lemons make lemonade")]
    );
    assert_eq!(read("FROM foo\nPARAMETER stop \"\"\"### User:\n\"\"\"\n")[1], pair("stop", "### User:\n"));
    assert_eq!(read("FROM foo\nSYSTEM \"\"\"\"\"\"\n")[1], pair("system", ""));
    assert_eq!(read("FROM foo\nSYSTEM \"'\"\n")[1], pair("system", "'"));
    assert_eq!(
        read("FROM foo\nMESSAGE system \"\"\"\nYou parse.\n\"\"\"\n\t\t\t")[1],
        pair("message", "system: \nYou parse.\n")
    );
    assert!(parse("FROM foo\nSYSTEM \"\"\"This is a multiline system.\"\"\n").is_err());
    assert!(parse("FROM foo\nMESSAGE system\n").is_err());
    assert!(parse("FROM foo\nPARAMETER param1\n").is_err());
}

#[test]
fn utf16_with_a_bom_round_trips_and_without_one_is_refused() {
    let text = "FROM x.gguf\r\nPARAMETER num_gpu 9\r\n";
    for enc in [Encoding::Utf16Le, Encoding::Utf16Be] {
        let bytes = encode(text, enc);
        let (back, e) = decode(&bytes).unwrap();
        assert_eq!((back.as_str(), e), (text, enc));
    }
    let no_bom: Vec<u8> = text.encode_utf16().flat_map(u16::to_le_bytes).collect();
    assert!(decode(&no_bom).unwrap_err().contains("UTF-16 without a byte-order mark"));
    assert!(decode(b"FROM \xff\n").unwrap_err().contains("not UTF-8"));
}
