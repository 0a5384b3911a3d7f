"""The client: :class:`~.client.ComputeClient` and its parts (dispatch, memory, data
movement, launcher, profiler; argument checks), tensors, graphs, ``to_client`` transfers
and array interop (DLPack).

May import: every server-side package (``server``, ``channel``, ``host``, ``cuda``) and below.

The routes of the main commands on CUDA, hop by hop (a hop in brackets is the carrier
that takes the command on: the channel, or the hot path, whose compiled module does what
its pure-Python twin ``cuda.native._twin`` does; ``tests/test_routes.py`` checks each name).
A launch, a small read of one buffer and a sync take the first route when the server's
``FastLaunch`` or ``FastSync`` takes them (``cuda.fast``, ``cuda.fast_sync`` say when),
else the second; so does ``wait`` on another library's work done within a few µs
(else the channel's ``request`` of ``cuda.foreign.ForeignOps.foreign_wait``)::

    route: client.client.ComputeClient.execute -> [cuda.native._twin.FastLaunch]
        -> driver:cuLaunchKernel
    route: client.client.ComputeClient.execute -> [channel.channel.Channel.send]
        -> client.launch.Launcher.launch -> [channel.channel.Channel.fire]
        -> cuda.launch.LaunchOps.execute -> [cuda.native._twin.launch] -> driver:cuLaunchKernel
    route: client.client.ComputeClient.read -> [cuda.native._twin.FastLaunch]
        -> driver:cuMemcpyDtoHAsync
    route: client.client.ComputeClient.read -> [channel.channel.Channel.request_tracked]
        -> client.movement.DataMovement.read_on_actor -> [channel.channel.Channel.await_completion]
        -> cuda.transfers.TransferOps.read -> cuda.transfers.TransferOps._read_one
        -> [cuda.native._twin.memcpy_async] -> driver:cuMemcpyDtoHAsync
    route: client.client.ComputeClient.sync -> [cuda.fast_sync.FastSync] -> driver:cuStreamQuery
    route: client.client.ComputeClient.sync -> [channel.channel.Channel.request]
        -> cuda.server.CudaServer.sync -> stream.multi.MultiStream.flush_pending
        -> cuda.streams.CudaBackend.flush -> cuda.completion.EventPool.record
        -> [cuda.native._twin.event_record] -> driver:cuEventRecord
    route: client.coordination.ClientCoordination.wait -> client.foreign.wait
        -> [cuda.fast_sync.FastSync.foreign] -> cuda.foreign.ForeignOps.foreign_done
        -> cuda.native.hotpath.poll_events -> [cuda.native._twin.event_query]
        -> driver:cuEventQuery

``to_client`` between two GPUs that reach each other (the staged route, through a read
and a ``create``, is the read route then the create's), and the exports of a tensor
(DLPack, then the CUDA Array Interface)::

    route: client.client.ComputeClient.to_client -> client.transfer.to_client
        -> [channel.channel.Channel.send] -> client.transfer._inline
        -> cuda.peer.import_copy -> [cuda.native._twin.memcpy_peer] -> driver:cuMemcpyPeerAsync
    route: client.tensor.Tensor.__dlpack__ -> client.interop.export_dlpack
        -> client.interop._export_cuda -> cuda.interop.InteropOps.export_to_stream
        -> driver:cuStreamWaitEvent
    route: client.tensor.Tensor.__cuda_array_interface__ -> client.interop.cuda_array_interface
        -> cuda.interop.InteropOps.export_pointer -> stream.multi.MultiStream.resolve
"""
