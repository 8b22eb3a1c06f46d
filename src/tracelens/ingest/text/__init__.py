"""Reading text, for every format: the chunked line reader (`lines`), pastes put back as printed
(`pasted`), launcher and shipper prefixes (`prefixes`), message bodies parsed by shape
(`shapes`), where a line glued onto another starts (`glued`), the shell context lines around a
tool's output (`shell_context`), and runs of zero bytes jumped over (`holes`: sparse-file holes and
gzip padding, for the line reader and discovery)."""
