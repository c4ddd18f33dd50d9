"""The committed Python stubs of proto/ are what the generator makes from the .proto today."""
from __future__ import annotations

import shutil

from tools import gen_proto


def test_committed_stubs_are_fresh():
    stale = gen_proto.stale_files()
    assert not stale, f"stale generated stubs {stale}: run `make proto` (python -m tools.gen_proto) and commit them"


def test_the_staleness_check_sees_an_edited_stub(tmp_path):
    for rel in gen_proto.GENERATED:
        dest = tmp_path / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(gen_proto.REPO / rel, dest)
    assert gen_proto.stale_files(tmp_path) == []
    edited = tmp_path / gen_proto.GENERATED[0]
    edited.write_text(edited.read_text() + "\n# edited\n")
    (tmp_path / gen_proto.GENERATED[2]).unlink()
    assert gen_proto.stale_files(tmp_path) == [gen_proto.GENERATED[0], gen_proto.GENERATED[2]]


def test_stubs_import_as_the_installed_package_names_them():
    from triton_llm.v1 import llm_service_pb2, llm_service_pb2_grpc

    assert llm_service_pb2.DESCRIPTOR.package == "triton_llm.v1"
    service = llm_service_pb2.DESCRIPTOR.services_by_name["LLMService"]
    assert [m.name for m in service.methods] == ["Generate", "Tokenize", "GetModelInfo"]
    assert service.methods_by_name["Generate"].server_streaming
    assert hasattr(llm_service_pb2_grpc, "LLMServiceStub")


def test_proto_follows_the_api_design_guide():
    """Enums start with an UNSPECIFIED zero, named after the enum; every RPC has its own messages."""
    from triton_llm.v1 import llm_service_pb2 as pb

    for enum in pb.DESCRIPTOR.enum_types_by_name.values():
        prefix = "".join("_" + c if c.isupper() else c for c in enum.name).lstrip("_").upper()
        assert enum.values_by_number[0].name == f"{prefix}_UNSPECIFIED", enum.name
        assert all(v.name.startswith(prefix + "_") for v in enum.values), enum.name
    for method in pb.DESCRIPTOR.services_by_name["LLMService"].methods:
        assert method.input_type.name == f"{method.name}Request"
    for message in pb.DESCRIPTOR.message_types_by_name.values():
        for f in message.fields:
            assert f.name == f.name.lower(), f"{message.name}.{f.name} is not snake_case"


def test_every_field_message_and_enum_value_is_commented(tmp_path):
    """The design guide's "comment every field": checked on protoc's source info."""
    import grpc_tools
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    out = tmp_path / "set.pb"
    well_known = gen_proto.Path(grpc_tools.__file__).parent / "_proto"
    assert protoc.main(["protoc", f"-I{gen_proto.PROTO_ROOT}", f"-I{well_known}", "--include_source_info",
                        f"--descriptor_set_out={out}", *gen_proto.PROTOS]) == 0
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    (f,) = fds.file
    commented = {tuple(loc.path) for loc in f.source_code_info.location if loc.leading_comments.strip()}
    missing = []

    def message(path, msg, name):
        if path not in commented:
            missing.append(name)
        for i, fld in enumerate(msg.field):
            if path + (2, i) not in commented:
                missing.append(f"{name}.{fld.name}")
        for i, nested in enumerate(msg.nested_type):
            if not nested.options.map_entry:   # a map field's entry type is protoc's, with no source to comment
                message(path + (3, i), nested, f"{name}.{nested.name}")

    for i, msg in enumerate(f.message_type):
        message((4, i), msg, msg.name)
    for i, enum in enumerate(f.enum_type):
        for j, value in enumerate(enum.value):
            if (5, i, 2, j) not in commented:
                missing.append(f"{enum.name}.{value.name}")
    for i, method in enumerate(f.service[0].method):
        if (6, 0, 2, i) not in commented:
            missing.append(f"LLMService.{method.name}")
    assert not missing, f"uncommented: {missing}"
