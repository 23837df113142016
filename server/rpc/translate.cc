#include "server/rpc/translate.h"

#include <algorithm>
#include <map>
#include <string>

namespace offloadd::rpc {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

namespace {

void OffloadFromProto(const v1::OffloadRequest& o, session::Request& r) {
  r.kind = session::RequestKind::kOffload;
  r.region_id = o.region_id();
  r.offset = o.offset();
  r.bytes = o.bytes();
  r.ready_event = o.ready_event();
  r.tag = o.tag();
  if (o.has_ordering()) {
    r.order.valid = true;
    r.order.step = o.ordering().step();
    r.order.position = o.ordering().position();
  }
}

void ReloadFromProto(const v1::ReloadRequest& l, session::Request& r) {
  r.kind = session::RequestKind::kReload;
  r.block_id = l.block_id();
  r.region_id = l.region_id();
  r.offset = l.offset();
  r.priority = static_cast<int>(l.priority());
  r.release_after = l.release_after();
  r.timeout_seconds = l.deadline_seconds();
  r.tag = l.tag();
  r.done_event = l.done_event();
  r.ready_event = l.ready_event();
}

void ClientReportFromProto(const v1::ClientReport& c, session::Request& r) {
  r.kind = session::RequestKind::kClientReport;
  r.report.fallbacks_total = c.fallbacks_total();
  r.report.host_waits_total = c.host_waits_total();
  r.report.host_wait_seconds_total = c.host_wait_seconds_total();
  r.report.idle_steps_total = c.idle_steps_total();
}

}  // namespace

session::Request FromProto(const v1::Request& p) {
  session::Request r;
  r.request_id = p.request_id();
  switch (p.body_case()) {
    case v1::Request::kHello:
      r.kind = session::RequestKind::kHello;
      r.client_name = p.hello().client_name();
      r.device_id = p.hello().device_id();
      r.pid = p.hello().pid();
      r.resume_token = p.hello().resume_token();
      r.transient_device = p.hello().transient_device();
      break;
    case v1::Request::kRegisterRegion: {
      r.kind = session::RequestKind::kRegisterRegion;
      const v1::RegionHandle& h = p.register_region().handle();
      r.region.shm_name = h.shm_name();
      r.region.cuda_ipc_handle = h.cuda_ipc_handle();
      r.region.size_bytes = h.size_bytes();
      break;
    }
    case v1::Request::kUnregisterRegion:
      r.kind = session::RequestKind::kUnregisterRegion;
      r.region_id = p.unregister_region().region_id();
      break;
    case v1::Request::kOffload:
      OffloadFromProto(p.offload(), r);
      break;
    case v1::Request::kReload:
      ReloadFromProto(p.reload(), r);
      break;
    case v1::Request::kRelease:
      r.kind = session::RequestKind::kRelease;
      r.block_id = p.release().block_id();
      r.tag = p.release().tag();
      break;
    case v1::Request::kClientReport:
      ClientReportFromProto(p.client_report(), r);
      break;
    default:
      r.kind = session::RequestKind::kUnknown;
  }
  return r;
}

void ToProto(const session::Completion& c, v1::Response* out) {
  out->set_request_id(c.request_id);
  switch (c.kind) {
    case session::CompletionKind::kError:
      out->mutable_error()->set_code(static_cast<int32_t>(c.status.code()));
      out->mutable_error()->set_message(std::string(c.status.message()));
      break;
    case session::CompletionKind::kHello: {
      v1::HelloReply* h = out->mutable_hello();
      h->set_session_id(c.id);
      h->set_backend(c.backend);
      h->set_pool_capacity_bytes(c.pool_capacity_bytes);
      h->set_session_quota_bytes(c.session_quota_bytes);
      h->set_chunk_bytes(c.chunk_bytes);
      h->set_link(c.link);
      h->set_resume_token(c.resume_token);
      h->set_blocks_resumed(c.blocks_resumed);
      h->set_resume_grace_seconds(c.resume_grace_seconds);
      for (uint64_t id : c.resumed_block_ids) h->add_resumed_block_ids(id);
      break;
    }
    case session::CompletionKind::kRegionRegistered:
      out->mutable_region_registered()->set_region_id(c.id);
      break;
    case session::CompletionKind::kRegionUnregistered:
      out->mutable_region_unregistered()->set_region_id(c.id);
      break;
    case session::CompletionKind::kOffloadDone: {
      v1::OffloadDone* d = out->mutable_offload_done();
      d->set_block_id(c.id);
      d->set_bytes(c.bytes);
      d->set_queued_seconds(c.queued_seconds);
      d->set_copy_seconds(c.copy_seconds);
      break;
    }
    case session::CompletionKind::kReloadDone: {
      v1::ReloadDone* d = out->mutable_reload_done();
      d->set_block_id(c.id);
      d->set_bytes(c.bytes);
      d->set_released(c.released);
      d->set_copy_seconds(c.copy_seconds);
      d->set_done_event_recorded(c.done_event_recorded);
      break;
    }
    case session::CompletionKind::kReleased:
      out->mutable_released()->set_block_id(c.id);
      break;
    case session::CompletionKind::kClientReportAck:
      out->mutable_client_report_ack();
      break;
  }
}

namespace {
void SpillToProto(const session::CoreStats& s, v1::SpillStats* d) {
  d->set_io(s.spill.io);
  d->set_capacity_bytes(s.spill.capacity_bytes);
  d->set_disk_bytes(s.store.disk_bytes);
  d->set_disk_blocks(s.store.disk_blocks);
  d->set_spill_bytes_total(s.spill.spill_bytes_total);
  d->set_stage_bytes_total(s.spill.stage_bytes_total);
  d->set_spilled_blocks_total(s.store.spilled_blocks_total);
  d->set_staged_blocks_total(s.store.staged_blocks_total);
  d->set_reloads_from_disk_total(s.store.reloads_from_disk_total);
  d->set_reload_disk_wait_seconds_total(s.store.reload_disk_wait_seconds_total);
  d->set_blocks_lost_total(s.store.blocks_lost_total);
  d->set_spill_failures_total(s.store.spill_failures_total +
                              s.store.spill_refused_disk_full_total);
  d->set_bytes_per_second(std::max(s.spill.bytes_per_second, 0.0));
  d->set_bytes_per_second_measured(s.spill.bytes_per_second_measured);
}

void LinkToProto(const session::LinkInfo& l, v1::LinkStats* p) {
  p->set_name(l.name);
  for (const std::string& g : l.gpus) p->add_gpus(g);
  p->set_d2h_capacity_bytes_per_second(l.d2h_bytes_per_second);
  p->set_h2d_capacity_bytes_per_second(l.h2d_bytes_per_second);
  p->set_d2h_bytes(l.d2h.bytes);
  p->set_h2d_bytes(l.h2d.bytes);
  p->set_d2h_busy_seconds(l.d2h.busy_seconds);
  p->set_h2d_busy_seconds(l.h2d.busy_seconds);
  std::map<std::string, v1::LinkGpuBytes*> gpus;
  auto gpu = [&](const std::string& id) {
    v1::LinkGpuBytes*& g = gpus[id];
    if (g == nullptr) {
      g = p->add_gpu_bytes();
      g->set_gpu(id);
      auto bus = l.gpu_bus_ids.find(id);
      if (bus != l.gpu_bus_ids.end()) g->set_pci_bus_id(bus->second);
    }
    return g;
  };
  for (const std::string& g : l.gpus) gpu(g);
  for (const auto& [id, bytes] : l.d2h.gpu_bytes) gpu(id)->set_d2h_bytes(bytes);
  for (const auto& [id, bytes] : l.h2d.gpu_bytes) gpu(id)->set_h2d_bytes(bytes);
  p->set_d2h_chunks_in_flight(l.d2h.chunks_in_flight);
  p->set_h2d_chunks_in_flight(l.h2d.chunks_in_flight);
  p->set_d2h_queued_transfers(l.d2h.queued_transfers);
  p->set_h2d_queued_transfers(l.h2d.queued_transfers);
  p->set_parent(l.parent);
  p->set_numa_node(l.numa_node);
  p->set_root_port(l.root_port);
  p->set_uplink_bdf(l.uplink_bdf);
  p->set_pcie_bytes_per_second(l.pcie_bytes_per_second);
  p->set_half_duplex(l.half_duplex);
  const auto cls = [&](sched::TrafficClass c) {
    const int i = static_cast<int>(c);
    return l.d2h.class_bytes[i] + l.h2d.class_bytes[i];
  };
  p->set_urgent_bytes(cls(sched::TrafficClass::kUrgent));
  p->set_prefetch_bytes(cls(sched::TrafficClass::kPrefetch));
  p->set_offload_bytes(cls(sched::TrafficClass::kOffload));
  p->set_mean_offload_bytes(l.mean_offload_bytes);
  p->set_measured_offload_copy_seconds(l.measured_offload_copy_seconds);
  p->set_planned_offload_copy_seconds(l.planned_offload_copy_seconds);
  p->set_d2h_capacity_calibrated(l.d2h_calibrated);
  p->set_h2d_capacity_calibrated(l.h2d_calibrated);
}

void HostLinkToProto(const session::HostLinkInfo& h, v1::HostLinkStats* p) {
  p->set_name(h.name);
  for (const std::string& l : h.links) p->add_links(l);
  p->set_d2h_capacity_bytes_per_second(h.d2h_bytes_per_second);
  p->set_h2d_capacity_bytes_per_second(h.h2d_bytes_per_second);
  p->set_d2h_bytes(h.d2h.bytes);
  p->set_h2d_bytes(h.h2d.bytes);
  p->set_d2h_busy_seconds(h.d2h.busy_seconds);
  p->set_h2d_busy_seconds(h.h2d.busy_seconds);
  p->set_numa_node(h.numa_node);
}
}  // namespace

void ToProto(const session::LinkCalibrationReport& r, v1::LinkCalibration* out) {
  out->set_started_at_unix_seconds(r.started_at_unix_seconds);
  out->set_seconds(r.seconds);
  out->set_budget_seconds(r.budget_seconds);
  out->set_note(r.note);
  for (const session::CalibratedLink& c : r.links) {
    v1::CalibratedLink* p = out->add_links();
    p->set_name(c.name);
    for (const session::CalibratedGpu& g : c.gpus) {
      v1::GpuCopyRates* q = p->add_gpus();
      q->set_gpu(g.gpu);
      q->set_d2h_bytes_per_second(g.d2h_bytes_per_second);
      q->set_h2d_bytes_per_second(g.h2d_bytes_per_second);
    }
    p->set_d2h_bytes_per_second(c.d2h_bytes_per_second);
    p->set_h2d_bytes_per_second(c.h2d_bytes_per_second);
    p->set_paced_d2h_bytes_per_second(c.paced_d2h_bytes_per_second);
    p->set_paced_h2d_bytes_per_second(c.paced_h2d_bytes_per_second);
    p->set_d2h_configured(c.d2h_configured);
    p->set_h2d_configured(c.h2d_configured);
    p->set_half_duplex(c.half_duplex);
    p->set_error(c.error);
    p->set_measured_at_unix_seconds(c.measured_at_unix_seconds);
    p->set_seconds(c.seconds);
  }
}

void ToProto(const session::CoreStats& s, v1::Stats* out) {
  out->set_backend(s.backend);
  out->set_pool_capacity_bytes(s.store.pool.capacity_bytes);
  out->set_pool_used_bytes(s.store.pool.used_bytes);
  out->set_pool_peak_used_bytes(s.store.pool.peak_used_bytes);
  out->set_pool_free_extents(s.store.pool.free_extents);
  out->set_pool_largest_free_bytes(s.store.pool.largest_free_bytes);
  out->set_blocks(s.store.blocks);
  out->set_sessions_open(s.sessions_open);
  out->set_offloads_waiting(s.store.offloads_waiting);
  out->set_offload_bytes_total(s.offload_bytes_total);
  out->set_reload_bytes_total(s.reload_bytes_total);
  out->set_offloads_total(s.offloads_total);
  out->set_reloads_total(s.reloads_total);
  out->set_errors_total(s.errors_total);
  out->set_uptime_seconds(s.uptime_seconds);
  out->set_chunk_bytes(s.chunk_bytes);
  if (s.spill_enabled) SpillToProto(s, out->mutable_spill());
  if (s.link_calibration.started_at_unix_seconds > 0) {
    ToProto(s.link_calibration, out->mutable_link_calibration());
  }
  for (const session::LinkInfo& l : s.links) LinkToProto(l, out->add_links());
  for (const session::HostLinkInfo& h : s.host_links) HostLinkToProto(h, out->add_host_links());
  for (const session::SessionInfo& i : s.sessions) ToProto(i, out->add_sessions());
  out->set_session_quota_bytes(s.session_quota_bytes);
  out->set_uid_quota_bytes(s.uid_quota_bytes);
  for (const auto& [uid, bytes] : s.uid_used_bytes) {
    v1::UidUsage* u = out->add_uid_usage();
    u->set_uid(uid);
    u->set_used_bytes(bytes);
  }
}

void ToProto(const session::SessionInfo& i, v1::SessionStats* p) {
  p->set_session_id(i.session_id);
  p->set_client_name(i.client_name);
  p->set_device_id(i.device_id);
  p->set_pid(i.pid);
  p->set_blocks(i.blocks);
  p->set_used_bytes(i.used_bytes);
  p->set_peer_known(i.peer_known);
  p->set_uid(i.uid);
  p->set_gid(i.gid);
  p->set_requests_in_flight(i.requests_in_flight);
  v1::ClientReport* r = p->mutable_client_report();
  r->set_fallbacks_total(i.client_report.fallbacks_total);
  r->set_host_waits_total(i.client_report.host_waits_total);
  r->set_host_wait_seconds_total(i.client_report.host_wait_seconds_total);
  r->set_idle_steps_total(i.client_report.idle_steps_total);
}

void ToProto(const projector::BlasCoreReport& r, v1::ProjectorBlas* p) {
  p->set_isa(std::string(projector::IsaLevelName(r.choice.isa)));
  p->set_core(r.loaded_core);
  p->set_openblas_core(r.choice.openblas_core);
  p->set_source(r.choice.source);
  p->set_self_check_gflops(r.self_check.gflops);
  p->set_self_check_expected_gflops(r.self_check.expected_gflops);
  p->set_self_check_slow(r.self_check.slow);
  for (const std::string& note : r.choice.notes) p->add_notes(note);
}

}  // namespace offloadd::rpc
