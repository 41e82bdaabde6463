"""truncate_gguf.py SRC DST N: writes SRC with only its first N blocks (every metadata key kept,
block_count set to N), e.g. an 8-layer cut of SmolLM2 that fits one `device` carry (64 MiB).
Run with the project venv (gguf): $(scripts/venv) scripts/peer-logprobs/truncate_gguf.py ..."""
import sys
import numpy as np
from gguf import GGUFReader, GGUFWriter, GGUFValueType

src, dst, n_layers = sys.argv[1], sys.argv[2], int(sys.argv[3])
reader = GGUFReader(src)
arch = reader.fields["general.architecture"].contents()
writer = GGUFWriter(dst, arch)
for name, field in reader.fields.items():
    if name.startswith("GGUF.") or name == "general.architecture":
        continue
    value, vtype = field.contents(), field.types[0]
    if name == f"{arch}.block_count":
        value = n_layers
    if vtype == GGUFValueType.ARRAY:
        writer.add_key_value(name, value, vtype, sub_type=field.types[-1])
    else:
        writer.add_key_value(name, value, vtype)
for t in reader.tensors:
    if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= n_layers:
        continue
    writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
writer.write_header_to_file()
writer.write_kv_data_to_file()
writer.write_tensors_to_file()
writer.close()
