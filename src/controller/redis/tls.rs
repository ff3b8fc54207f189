//! `spec.tls`: the certificate Secret, read and checked on every pass
//! before any server gets it, the options of the operator's own
//! connections (the CA bundle, chain checked, names not), and live
//! renewal: an instance serving another certificate than the Secret's is
//! told to read its files again (`CONFIG SET tls-cert-file …`), until a
//! handshake shows the Secret's certificate (the kubelet updates mounted
//! Secrets within a minute or so, so a reload may come early and be
//! repeated). No restart.

use k8s_openapi::api::core::v1::Secret;
use kube::runtime::events::EventType;

use super::Reconciler;
use super::auth::ServerAuth;
use super::facts::PodFacts;
use super::material::{TlsMaterial, Uses, read};
use crate::api::v1alpha1::Redis;
use crate::controller::error::Error;
use crate::controller::layout::{CA_FILE, CERT_FILE, KEY_FILE, asks_clients};
use crate::controller::names;
use crate::redis::{ConnectOptions, Endpoint, Listeners, TlsOptions, certs};

/// What a Cluster Redis's servers are told live to turn TLS on (`on`,
/// with `spec.tls.clientAuth`'s setting) or off: the one port switches
/// between plain text and TLS, and the cluster bus and replication follow.
/// One `CONFIG SET`, applied by the server as a whole.
pub fn switch_params(on: bool, client_auth: &str) -> Vec<(&'static str, String)> {
    let port = names::REDIS_PORT.to_string();
    if on {
        vec![
            ("port", "0".into()),
            ("tls-port", port),
            ("tls-cluster", "yes".into()),
            ("tls-replication", "yes".into()),
            ("tls-auth-clients", client_auth.into()),
        ]
    } else {
        vec![
            ("tls-port", "0".into()),
            ("port", port),
            ("tls-cluster", "no".into()),
            ("tls-replication", "no".into()),
        ]
    }
}

/// Whether a Cluster Redis is turning TLS on (`wanted`) or off and its
/// children are built from the flip's view (see `Reconciler::cluster_view`):
/// a node runs a template of the other way or of the flip, no node runs
/// the new way's template, not every node is known to listen the new way
/// yet (switched live), and no shard's StatefulSet has the new way's
/// template (`final_template`). Nodes whose way could not be told
/// (`listen_unknown`) count for neither side.
pub(super) fn flip_in_progress(facts: &[PodFacts], wanted: bool, final_template: bool) -> bool {
    let behind = facts.iter().any(|f| f.either || f.listens_tls != wanted);
    let arrived = facts.iter().any(|f| !f.either && f.listens_tls == wanted);
    let mut known = facts.iter().filter(|f| !f.listen_unknown).peekable();
    let switched = known.peek().is_some() && known.all(|f| f.listens_tls == wanted);
    behind && !arrived && !switched && !final_template
}

/// The Secret a pod mounts as its server's TLS files.
pub(super) fn mounted_secret(pod: &k8s_openapi::api::core::v1::Pod) -> Option<String> {
    pod.spec
        .as_ref()?
        .volumes
        .as_ref()?
        .iter()
        .find(|v| v.name == crate::controller::layout::TLS_VOLUME)?
        .secret
        .as_ref()?
        .secret_name
        .clone()
}

/// Why a pass has no certificate to serve.
pub enum Unready {
    /// The Secret cannot be used, or the certificate cannot be had: the
    /// Redis is Degraded with it.
    Unusable(Error),
    /// Issuance under way (cert-manager's): what the pass waits for.
    Waiting(String),
}

/// How soon an instance whose mounted files still hold the old certificate
/// is told again to read them.
const RELOAD_RECHECK: std::time::Duration = std::time::Duration::from_secs(3);

impl Reconciler {
    /// How the operator's connections to the server at `ip` use TLS this
    /// pass (the CA bundle it trusts, the certificate it presents), for
    /// the monitor: per server while TLS is turned on or off.
    pub(super) fn tls_options_for(&self, ip: &str) -> Option<TlsOptions> {
        match &self.reach.listeners {
            Some(l) => l
                .tls_for(Endpoint::new(ip, names::REDIS_PORT).host())
                .cloned(),
            None => self.reach.tls.as_ref().map(|t| t.options.clone()),
        }
    }

    /// While TLS is turned off (`spec.tls` removed, an instance still
    /// listening with TLS): the certificate Secret its pod mounts, `name`,
    /// read and checked, to reach the instances that still listen with
    /// TLS. A Secret that cannot be used is reported as progress held up
    /// (those instances cannot be reached without it).
    pub(super) async fn leaving_material(
        &mut self,
        name: &str,
        applied_ca: Option<&str>,
    ) -> Option<TlsMaterial> {
        let secret: Option<Secret> = match self.fetch(name).await {
            Ok(s) => s,
            Err(e) => {
                self.report
                    .progress(format!("turning TLS off: reading Secret {name}: {e}"));
                return None;
            }
        };
        let field = "the certificate Secret the instances mount while TLS is turned off";
        match read(name, secret.as_ref(), applied_ca, field, Uses::default()) {
            Ok(m) => Some(m),
            Err(e) => {
                self.report.progress(format!(
                    "turning TLS off: {e}; instances that still listen with TLS cannot be reached without it"
                ));
                None
            }
        }
    }

    /// Which servers listen with TLS, when not all listen the way
    /// `spec.tls` says (pods of the template before the change): `None`
    /// when they all do.
    pub(super) fn listeners_of(&self, facts: &[PodFacts]) -> Option<Listeners> {
        let wanted = self.redis.spec.tls.is_some();
        if facts.iter().all(|f| f.listens_tls == wanted) {
            return None;
        }
        let tls = self
            .reach
            .tls
            .as_ref()
            .or(self.reach.leaving_tls.as_ref())?;
        let tls_hosts = facts
            .iter()
            .filter(|f| f.listens_tls)
            .filter_map(|f| f.ip.as_deref())
            .map(|ip| Endpoint::new(ip, names::REDIS_PORT).host().to_string())
            .collect();
        Some(Listeners {
            tls: tls.options.clone(),
            tls_hosts,
        })
    }

    /// The Redis the children are built from: while TLS is turned off and
    /// an instance still listens with TLS, a Replication Redis keeps the
    /// certificate files (plain text on the port) so its restarted
    /// replicas can follow a primary that listens with TLS; otherwise the
    /// Redis as it is.
    pub(super) fn children_view(&self, facts: &[PodFacts]) -> std::sync::Arc<Redis> {
        if self.redis.spec.mode() == crate::api::v1alpha1::Mode::Cluster {
            return self.cluster_view(facts);
        }
        let leaving = self
            .reach
            .leaving_tls
            .as_ref()
            .filter(|_| self.redis.spec.tls.is_none())
            .filter(|_| self.redis.spec.mode() == crate::api::v1alpha1::Mode::Replication)
            .filter(|_| facts.iter().any(|f| f.listens_tls));
        let Some(m) = leaving else {
            return self.redis.clone();
        };
        let mut view = (*self.redis).clone();
        view.spec.tls = Some(crate::api::v1alpha1::TlsSpec {
            secret_name: Some(m.secret.clone()),
            files_only: true,
            ..Default::default()
        });
        std::sync::Arc::new(view)
    }

    /// A Cluster Redis turning TLS on or off. Restarting its nodes one by
    /// one onto the other way would split the cluster bus (a node that
    /// speaks TLS on it and one that does not cannot talk), so:
    /// 1. the nodes roll (the ordered restart) onto a template that starts
    ///    them as before, with the certificate files mounted and a
    ///    readiness probe that answers either way (`TlsSpec::either`);
    /// 2. the operator switches every node live at once
    ///    ([`Self::switch_cluster_tls`]: the port, the bus, replication);
    /// 3. the nodes roll onto the template that starts them the new way.
    ///
    /// The children are built from the flip's view while
    /// [`flip_in_progress`] says so: the Redis as it is otherwise, and
    /// always once a shard's StatefulSet has the new way's template (the
    /// last roll began: a pass that cannot tell how a node listens never
    /// takes the ConfigMap and the templates back to the flip's, which
    /// would start a node the other way than its template says).
    fn cluster_view(&self, facts: &[PodFacts]) -> std::sync::Arc<Redis> {
        let wanted = self.redis.spec.tls.is_some();
        // (The StatefulSets are read only while the pods say a flip runs.)
        if !flip_in_progress(facts, wanted, false) || self.final_template_applied(wanted) {
            return self.redis.clone();
        }
        let tls = match (&self.redis.spec.tls, &self.reach.leaving_secret) {
            (Some(t), _) => crate::api::v1alpha1::TlsSpec {
                files_only: true,
                either: true,
                ..t.clone()
            },
            (None, Some(secret)) => crate::api::v1alpha1::TlsSpec {
                secret_name: Some(secret.clone()),
                either: true,
                ..Default::default()
            },
            // Turning TLS off, and no pod names its Secret: nothing to
            // keep the bus whole with (cannot happen while a node listens
            // with TLS: its pod mounts one).
            (None, None) => return self.redis.clone(),
        };
        let mut view = (*self.redis).clone();
        view.spec.tls = Some(tls);
        std::sync::Arc::new(view)
    }

    /// Whether a shard's StatefulSet (from the cache) has the template
    /// that starts the server the `wanted` way, not the flip's.
    fn final_template_applied(&self, wanted: bool) -> bool {
        (0..crate::api::v1alpha1::MAX_SHARDS)
            .map(|shard| super::cluster::build::shard_statefulset_name(&self.names, shard))
            .map_while(|name| self.cached::<k8s_openapi::api::apps::v1::StatefulSet>(&name))
            .any(|sts| super::kept::listens_as(&sts) == (wanted, false))
    }

    /// For every pod of a Cluster TLS flip's template (`either`): whether
    /// its server listens in plain text now, by a plain `PING`, or with
    /// TLS, by a handshake (each bounded by the connect timeout); one that
    /// answers neither is marked `listen_unknown`.
    pub(super) async fn handshake_either(&self, facts: &mut [PodFacts], opts: &ConnectOptions) {
        let Some(tls) = self.reach.tls.as_ref().or(self.reach.leaving_tls.as_ref()) else {
            // No TLS settings to try with (the Secret unreadable this pass).
            for f in facts.iter_mut().filter(|f| f.either) {
                f.listen_unknown = true;
            }
            return;
        };
        let mut with_tls = opts.clone().with_tls(tls.options.clone());
        with_tls.listeners = None;
        let asks = facts
            .iter()
            .enumerate()
            .filter(|(_, f)| f.either)
            .filter_map(|(i, f)| Some((i, f.ip.clone()?)))
            .map(|(i, ip)| {
                let with_tls = &with_tls;
                async move {
                    let ep = Endpoint::new(&ip, names::REDIS_PORT);
                    // Plain text first: a TLS port refuses it at once,
                    // while a handshake sent to a plain-text port waits.
                    let way = if crate::redis::rdb::answers_plain(&ep, with_tls).await {
                        Some(false)
                    } else if crate::redis::rdb::served_certificate(&ep, with_tls)
                        .await
                        .is_ok()
                    {
                        Some(true)
                    } else {
                        None
                    };
                    (i, way)
                }
            });
        for (i, way) in futures::future::join_all(asks).await {
            if let Some(f) = facts.get_mut(i) {
                match way {
                    Some(tls) => f.listens_tls = tls,
                    None => f.listen_unknown = true,
                }
            }
        }
    }

    /// Step 2 of turning TLS on or off on a Cluster Redis (see
    /// [`Self::cluster_view`]): once every node runs the flip's template,
    /// Ready, and the cluster is `healthy`, every node that still listens
    /// the old way is switched live, all at once (the bus is split between
    /// the first and the last switched node for about a round trip; its
    /// links reconnect the new way). Later, a node of the flip's template
    /// found listening the old way (restarted before its last roll) is
    /// switched alone. Whether it switched any (the rest of the pass then
    /// waits: its connections went the old way).
    pub(super) async fn switch_cluster_tls(
        &mut self,
        facts: &[PodFacts],
        opts: &ConnectOptions,
        healthy: bool,
    ) -> bool {
        let on = self.redis.spec.tls.is_some();
        let todo: Vec<(String, String)> = facts
            .iter()
            .filter(|f| f.either && !f.listen_unknown && f.listens_tls != on)
            .filter(|f| f.reachable && !f.terminating)
            .filter_map(|f| Some((f.name.clone(), f.ip.clone()?)))
            .collect();
        if todo.is_empty() {
            return false;
        }
        let way = if on { "on" } else { "off" };
        let first = self
            .children_view(facts)
            .spec
            .tls
            .as_ref()
            .is_some_and(|t| t.either);
        if first && !(healthy && facts.iter().all(|f| f.either && !f.outdated && f.ready)) {
            self.report.progress(format!(
                "turning TLS {way}: every node restarts onto a template that answers either way, then all are switched live at once"
            ));
            return false;
        }
        let client_auth = self
            .redis
            .spec
            .tls
            .as_ref()
            .map(|t| t.client_auth().config_value())
            .unwrap_or("no");
        let params = switch_params(on, client_auth);
        let switched = futures::future::join_all(todo.iter().map(|(pod, ip)| {
            let params = &params;
            async move {
                let ep = Endpoint::new(ip, names::REDIS_PORT);
                let r = async {
                    let mut node = crate::redis::Node::connect(&ep, opts).await?;
                    crate::redis::actions::config_set_all(&mut node, params).await
                }
                .await;
                (pod.clone(), r)
            }
        }))
        .await;
        let mut done = Vec::new();
        for (pod, r) in switched {
            match r {
                Ok(()) => done.push(pod),
                Err(e) => {
                    self.data_plane_failed(format!("turning TLS {way} live on {pod}"), &e)
                        .await
                }
            }
        }
        if !done.is_empty() {
            let note = format!(
                "turned TLS {way} live on {} (client port, replication and cluster bus); the nodes now roll onto the template that starts them so",
                done.join(", ")
            );
            self.report.progress(note.clone());
            // One action each way: the event recorder folds repeats of one
            // (reason, action) into the first event's series.
            let action = if on { "SwitchTlsOn" } else { "SwitchTlsOff" };
            self.event(EventType::Normal, "TlsSwitched", action, note)
                .await;
        }
        self.report.recheck_within(RELOAD_RECHECK);
        true
    }

    /// A replica whose link to its primary is down replicates the way the
    /// primary listens (`tls-replication`): a replica restarted with the
    /// other template while TLS is turned on or off does not at boot, and
    /// one given the other way then keeps it after the turn is done. Given
    /// the primary itself, it takes the way it listens. Whether it changed
    /// the setting (a failure is reported, and counts as no change).
    pub(super) async fn match_replication_tls(
        &mut self,
        f: &PodFacts,
        ep: &Endpoint,
        primary_ip: &str,
        opts: &ConnectOptions,
    ) -> bool {
        let want = opts
            .tls_for(Endpoint::new(primary_ip, names::REDIS_PORT).host())
            .is_some();
        let value = if want { "yes" } else { "no" };
        let done = async {
            let mut node = crate::redis::Node::connect(ep, opts).await?;
            let now: Vec<String> = node
                .query(
                    "CONFIG GET",
                    redis::cmd("CONFIG").arg("GET").arg("tls-replication"),
                )
                .await?;
            if now.get(1).map(String::as_str) == Some(value) {
                return Ok(false);
            }
            crate::redis::actions::replicate_with_tls(&mut node, want).await?;
            Ok::<bool, crate::redis::Error>(true)
        }
        .await;
        match done {
            Ok(true) => {
                let how = if want { "with TLS" } else { "in plain text" };
                self.report.progress(format!(
                    "{}: tls-replication {value}, as {primary_ip} listens {how}",
                    f.name
                ));
                if opts.listeners.is_none() {
                    // Outside a turn this is a repair: said in an event.
                    let note = format!(
                        "{} replicated {} from {primary_ip}, which listens {how}; \
                         tls-replication set to {value}",
                        f.name,
                        if want { "in plain text" } else { "with TLS" }
                    );
                    self.event(EventType::Warning, "ReplicaLinkRepaired", "Replicate", note)
                        .await;
                }
                self.report.recheck_within(RELOAD_RECHECK);
                true
            }
            Ok(false) => false,
            Err(e) => {
                self.data_plane_failed(format!("setting tls-replication on {}", f.name), &e)
                    .await;
                false
            }
        }
    }

    /// Step 1b of every pass: the certificate Secret when `spec.tls` is
    /// set. The inner error is a Secret that cannot be used (for the
    /// status), or an issuance to wait for.
    pub(super) async fn tls_material(
        &mut self,
        auth: &ServerAuth,
        paused: bool,
    ) -> Result<Result<Option<TlsMaterial>, Unready>, Error> {
        let Some(spec) = self.redis.spec.tls.clone() else {
            return Ok(Ok(None));
        };
        // The API failing is retried; a certificate that cannot be had is
        // reported.
        let unusable = |e: Error| match e {
            // A name someone else holds ends the pass (see `run`).
            Error::Kube(_) | Error::Conflict { .. } => Err(e),
            e => Ok(Err(Unready::Unusable(e))),
        };
        let (name, secret, field) = match (spec.secret_name, spec.issuer_ref) {
            (Some(name), _) => {
                let secret: Option<Secret> = self.fetch(&name).await?;
                (name, secret, "spec.tls.secretName")
            }
            (None, Some(issuer)) => match self.ensure_certificate(&issuer, paused).await {
                Ok(super::certmanager::Issued::Secret(secret)) => (
                    self.names.certificate_secret(),
                    Some(*secret),
                    super::certmanager::FIELD,
                ),
                Ok(super::certmanager::Issued::Waiting(what)) => {
                    return Ok(Err(Unready::Waiting(what)));
                }
                Err(e) => return unusable(e),
            },
            (None, None) => match self.ensure_issued(paused, auth.tls_served.as_deref()).await {
                Ok(secret) => (self.names.issued_tls(), secret, "spec.tls"),
                Err(e) => return unusable(e),
            },
        };
        let uses = Uses {
            bus: self.redis.spec.mode() == crate::api::v1alpha1::Mode::Cluster,
            client_auth: asks_clients(&self.redis),
        };
        Ok(
            read(&name, secret.as_ref(), auth.tls_ca.as_deref(), field, uses)
                .map(Some)
                .map_err(Unready::Unusable),
        )
    }

    /// Live renewal: every reachable instance that serves another
    /// certificate than the Secret's reads its files again; once every
    /// instance serves it, its CA bundle is recorded as the one applied.
    pub(super) async fn reload_certificates(
        &mut self,
        facts: &[PodFacts],
        opts: &ConnectOptions,
        auth: &ServerAuth,
    ) -> Result<(), Error> {
        let Some(t) = self.reach.tls.clone() else {
            return Ok(());
        };
        let mut all = !facts.is_empty();
        for f in facts.iter() {
            let Some(ip) = f.ip.as_deref().filter(|_| f.reachable && !f.terminating) else {
                all = false;
                continue;
            };
            let ep = Endpoint::new(ip, names::REDIS_PORT);
            // One that still listens in plain text (TLS being turned on)
            // serves no certificate yet.
            if opts.tls_for(ep.host()).is_none() {
                all = false;
                continue;
            }
            let loaded = |served: &[Vec<u8>]| certs::serves(served, &t.chain, t.ca_pem.as_bytes());
            let served = crate::redis::rdb::served_chain(&ep, opts).await;
            match served {
                Ok(chain) if loaded(&chain) => continue,
                Ok(_) => {}
                Err(e) => {
                    all = false;
                    self.data_plane_failed(
                        format!("checking the certificate {} serves", f.name),
                        &e,
                    )
                    .await;
                    continue;
                }
            }
            all = false;
            self.report.wrote();
            let reloaded = async {
                let mut node = crate::redis::Node::connect(&ep, opts).await?;
                reload(&mut node).await?;
                crate::redis::rdb::served_chain(&ep, opts).await
            }
            .await;
            match reloaded {
                Ok(chain) if loaded(&chain) => {
                    let note = format!(
                        "{} serves the renewed certificate (read live, no restart)",
                        f.name
                    );
                    self.event(EventType::Normal, "CertificateReloaded", "Reload", note)
                        .await;
                    // Counted as done on the next pass, which sees it (and
                    // records the CA once every instance serves it).
                    self.report.recheck_in(RELOAD_RECHECK);
                }
                Ok(_) => {
                    self.report.progress(format!(
                        "{}: its mounted certificate files are not the Secret's yet (the kubelet updates them within a minute or so); reading them again",
                        f.name
                    ));
                    self.report.recheck_in(RELOAD_RECHECK);
                }
                Err(e) => {
                    self.data_plane_failed(format!("reloading the certificate on {}", f.name), &e)
                        .await
                }
            }
        }
        let recorded = |a: &ServerAuth| {
            a.tls_ca.as_deref() == Some(t.ca_pem.as_str())
                && a.tls_served.as_deref() == Some(t.files_hash.as_str())
        };
        if all && !recorded(auth) {
            // Read again: an earlier step of this pass may have written it.
            let live: Option<Secret> = self.fetch(&self.names.server_auth()).await?;
            if let Some(mut next) = live.as_ref().and_then(super::auth::read_server_auth)
                && !recorded(&next)
            {
                next.tls_ca = Some(t.ca_pem.clone());
                next.tls_served = Some(t.files_hash.clone());
                self.write_server_auth(&next).await?;
                // A change of CA goes on in steps, each once every
                // instance serves the one before (see `issuer`).
                self.report.recheck_in(RELOAD_RECHECK);
            }
        }
        Ok(())
    }
}

/// Tells a server to read its certificate, key and CA files again (the
/// same paths: setting a TLS file parameter reloads the TLS configuration).
async fn reload(node: &mut crate::redis::Node) -> crate::redis::Result<()> {
    let dir = names::TLS_DIR;
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("SET");
    for (k, f) in [
        ("tls-cert-file", CERT_FILE),
        ("tls-key-file", KEY_FILE),
        ("tls-ca-cert-file", CA_FILE),
    ] {
        cmd.arg(k).arg(format!("{dir}/{f}"));
    }
    node.query::<()>("CONFIG SET", &cmd).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use std::collections::BTreeMap;

    /// A node of a Cluster Redis: `either` (the flip's template),
    /// `tls` (how it listens), `unknown` (its way could not be told).
    fn node(either: bool, tls: bool, unknown: bool) -> PodFacts {
        PodFacts {
            either,
            listens_tls: tls,
            listen_unknown: unknown,
            ..Default::default()
        }
    }

    #[test]
    fn the_flip_view_holds_until_every_node_listens_the_new_way_and_never_comes_back() {
        let on = true;
        // Turning TLS on: nodes on the plain template, then some on the
        // flip's (still plain): the flip's view.
        assert!(flip_in_progress(
            &vec![node(false, false, false); 3],
            on,
            false
        ));
        let rolling = [
            node(true, false, false),
            node(false, false, false),
            node(false, false, false),
        ];
        assert!(flip_in_progress(&rolling, on, false));
        // All on the flip's template, not yet switched; one unanswered:
        // still the flip's view.
        let before = [
            node(true, false, false),
            node(true, false, true),
            node(true, false, false),
        ];
        assert!(flip_in_progress(&before, on, false));
        // Switched live: the new way's templates.
        assert!(!flip_in_progress(
            &vec![node(true, true, false); 3],
            on,
            false
        ));
        // Switched, and one node did not answer this pass (down, or too
        // slow under load): it counts for neither side, the view stays.
        let one_silent = [
            node(true, true, false),
            node(true, false, true),
            node(true, true, false),
        ];
        assert!(!flip_in_progress(&one_silent, on, false));
        // None answered: nothing known, not switched.
        assert!(flip_in_progress(
            &vec![node(true, false, true); 3],
            on,
            false
        ));
        // The last roll began (a node runs the new way's template): final.
        let arrived = [
            node(false, true, false),
            node(true, true, false),
            node(true, false, true),
        ];
        assert!(!flip_in_progress(&arrived, on, false));
        // The rolled node's pod is being recreated (not among the facts)
        // and another node reads as the old way: a shard's StatefulSet
        // already has the new way's template, so the view never goes back.
        let gap = [node(true, false, false), node(true, true, false)];
        assert!(flip_in_progress(&gap, on, false));
        assert!(!flip_in_progress(&gap, on, true));
        // Turning TLS off mirrors it.
        assert!(flip_in_progress(
            &vec![node(false, true, false); 3],
            false,
            false
        ));
        assert!(!flip_in_progress(
            &vec![node(true, false, false); 3],
            false,
            false
        ));
        // No nodes, no flip.
        assert!(!flip_in_progress(&[], on, false));
    }

    fn secret(files: &[(&str, &str)]) -> Secret {
        Secret {
            data: Some(
                files
                    .iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Default::default()
        }
    }

    /// A CA and a certificate it signed, valid now, with `usages` as its
    /// extended key usage: the Secret's three files.
    fn files(usages: Vec<rcgen::ExtendedKeyUsagePurpose>) -> Secret {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().expect("key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_pem = ca.self_signed(&ca_key).expect("CA").pem();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().expect("key");
        let mut leaf = CertificateParams::new(vec!["cache.ns.svc".to_string()]).expect("params");
        leaf.extended_key_usages = usages;
        let cert = leaf.signed_by(&key, &issuer).expect("leaf").pem();
        secret(&[
            ("tls.crt", &cert),
            ("tls.key", &key.serialize_pem()),
            ("ca.crt", &ca_pem),
        ])
    }

    #[test]
    fn the_operator_presents_the_certificate_when_it_may_and_client_auth_needs_it_to() {
        use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        let field = "spec.tls.secretName";
        let uses = |client_auth, bus| Uses { bus, client_auth };
        // Any purpose, or both: presented, whatever clientAuth says.
        for usages in [vec![], vec![ServerAuth, ClientAuth]] {
            let s = files(usages);
            for u in [uses(false, false), uses(true, false), uses(false, true)] {
                let m = read("certs", Some(&s), None, field, u).expect("usable");
                assert!(
                    m.options.client_cert_pem.is_some() && m.options.client_key_pem.is_some(),
                    "{u:?}"
                );
            }
        }
        // For servers only: served, never presented; refused where clients
        // must present it.
        let s = files(vec![ServerAuth]);
        let m = read("certs", Some(&s), None, field, uses(false, false)).expect("usable");
        assert!(m.options.client_cert_pem.is_none() && m.options.client_key_pem.is_none());
        let e = read("certs", Some(&s), None, field, uses(true, false)).expect_err("clientAuth");
        assert!(
            e.to_string().contains("no clientAuth")
                && e.to_string()
                    .contains("spec.tls.clientAuth has the operator's processes present it"),
            "{e}"
        );
        let e = read("certs", Some(&s), None, field, uses(false, true)).expect_err("bus");
        assert!(
            e.to_string()
                .contains("the Cluster bus asks every node for it"),
            "{e}"
        );
        // The key never shows in an error.
        assert!(!e.to_string().contains("PRIVATE KEY"), "{e}");
    }

    #[test]
    fn a_missing_secret_or_file_names_the_field_and_the_file() {
        let e =
            read("certs", None, None, "spec.tls.secretName", Uses::default()).expect_err("absent");
        assert_eq!(
            e.to_string(),
            "secret certs: not found (spec.tls.secretName)"
        );
        let e = read(
            "certs",
            Some(&secret(&[("tls.crt", "x"), ("tls.key", "y")])),
            None,
            "spec.tls.secretName",
            Uses::default(),
        )
        .expect_err("no CA");
        assert_eq!(
            e.to_string(),
            "secret certs: has no ca.crt (spec.tls.secretName)"
        );
        let read_ca = |ca: &str| {
            let files = [("tls.crt", "x"), ("tls.key", "k3y-bytes"), ("ca.crt", ca)];
            read(
                "certs",
                Some(&secret(&files)),
                None,
                "spec.tls.secretName",
                Uses::default(),
            )
            .expect_err(ca)
        };
        let e = read_ca("");
        assert_eq!(
            e.to_string(),
            "secret certs: has no ca.crt (spec.tls.secretName)"
        );
        let e = read_ca("z");
        assert!(e.to_string().starts_with("secret certs: ca.crt "), "{e}");
        assert!(!e.to_string().contains("k3y-bytes"), "{e}");
    }
}
