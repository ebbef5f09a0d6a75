;;; magent-store-alloc-tests.el --- What a streamed chunk allocates  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Allocation turns into garbage collections in the user's Emacs, and it
;; is deterministic: `memory-use-counts' before and after a stream says
;; exactly what was allocated, with no timing in it.  These tests stream
;; chunks through the byte-compiled shim into the real backend, ticks
;; and their replies included, and bound the bytes per chunk beyond the
;; chunk itself.  The bounds are structural: a chunk may cost its time
;; (one float) and its share of the ticks, and nothing that grows with
;; every chunk (a list per chunk, a copy of the chunk, a per-chunk
;; timer) fits under them.  tests/elisp/upstream/ has the same through
;; magent's own append with `magent-store-mode' on.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'magent-store-tests)

(defun magent-store-alloc-test--compile ()
  "Byte-compile the shim's functions in memory, as users load them."
  (mapatoms (lambda (symbol)
              (when (and (fboundp symbol)
                         (string-prefix-p "magent-store" (symbol-name symbol))
                         (not (autoloadp (symbol-function symbol)))
                         (not (macrop symbol))
                         (not (byte-code-function-p (symbol-function symbol)))
                         (not (advice--p (symbol-function symbol))))
                (let ((byte-compile-warnings nil))
                  (byte-compile symbol))))))

(defun magent-store-alloc-test--bytes (counts)
  "Return the bytes the `memory-use-counts' difference COUNTS stands for."
  (let ((gc (garbage-collect)))
    (cl-loop for n in counts
             for kind in '(conses floats vector-slots symbols string-bytes
                                  intervals strings)
             sum (* n (or (nth 1 (assq kind gc)) 0)))))

(defun magent-store-alloc-test--chunks (n)
  "Return a vector of N distinct chunks, made before anything is counted."
  (let ((chunks (make-vector n nil)))
    (dotimes (i n)
      (aset chunks i (format "chunk %d é 漢字 \"q\" \\ \n" i)))
    chunks))

(defmacro magent-store-alloc-test--counting (&rest body)
  "Run BODY; return the `memory-use-counts' difference it made."
  (declare (indent 0) (debug t))
  `(progn
     (garbage-collect)
     (let ((before (memory-use-counts)))
       ,@body
       (cl-mapcar #'- (memory-use-counts) before))))

(defun magent-store-alloc-test--wait (session)
  "Wait, running no timers, until the backend answered SESSION's batches."
  (let ((process (magent-store--backend-connection magent-store--backend)))
    (while (magent-store--session-inflight session)
      (accept-process-output process 0.05 nil 1))))

(defun magent-store-alloc-test--stream (send chunks session)
  "Call SEND on each of CHUNKS, a tick of SESSION after every 33.
33 chunks is a tick's worth at 131 chunks/s; after every fourth tick
\(a second's worth), take the replies, as a streaming Emacs does."
  (let ((i 0) (n (length chunks)))
    (while (< i n)
      (funcall send (aref chunks i))
      (setq i (1+ i))
      (when (and session (= 0 (% i 33)))
        (magent-store--tick session)
        (when (= 0 (% i 132))
          (magent-store-alloc-test--wait session))))
    (when session
      (magent-store--tick session)
      (magent-store-alloc-test--wait session))))

(ert-deftest magent-store-alloc-a-chunk-allocates-its-time-and-share-of-a-tick ()
  "Through the public API a chunk costs at most 64 bytes, ticks included.
That is its time (one float) and its share of the ticks and replies:
the list a chunk used to be queued as was 80 bytes by itself."
  (magent-store-test--with-backend
    (magent-store-alloc-test--compile)
    (magent-store-open "s-alloc")
    (magent-store-test--start-turn "s-alloc")
    (magent-store-flush "s-alloc")
    (let* ((n 396)
           (session (gethash "s-alloc" magent-store--sessions))
           (magent-store-flush-interval 3600)
           (send (byte-compile
                  (lambda (chunk)
                    (magent-store-append-item-content "s-alloc" "item-1" chunk)
                    (magent-store-request-flush "s-alloc"))))
           (idle (byte-compile (lambda (_chunk) nil)))
           ;; A first stream fills the reused batch vectors.
           (_ (magent-store-alloc-test--stream
               send (magent-store-alloc-test--chunks n) session))
           (chunks (magent-store-alloc-test--chunks n))
           (with (magent-store-alloc-test--counting
                   (magent-store-alloc-test--stream send chunks session)))
           (without (magent-store-alloc-test--counting
                      (magent-store-alloc-test--stream idle chunks nil)))
           (per-chunk (/ (float (magent-store-alloc-test--bytes
                                 (cl-mapcar #'- with without)))
                         n)))
      (message "public API: %.1f bytes per chunk (%S)" per-chunk
               (cl-mapcar #'- with without))
      (should (<= per-chunk 64))
      ;; Every chunk arrived, in order.
      (should (equal (magent-store-test--content
                      (magent-store-load "s-alloc"))
                     (concat (mapconcat #'identity
                                        (magent-store-alloc-test--chunks n) "")
                             (mapconcat #'identity chunks "")))))))

(ert-deftest magent-store-alloc-no-timer-is-pending-while-chunks-stream ()
  "While a batch awaits its reply, no flush timer is pending.
Emacs copies and decodes every pending timer each time it wakes up;
the reply, held a second at most, sends what queued meanwhile."
  (magent-store-test--with-backend
    (magent-store-open "s-timer")
    (magent-store-test--start-turn "s-timer")
    (magent-store-flush "s-timer")
    (let ((session (gethash "s-timer" magent-store--sessions))
          (magent-store-flush-interval 0.05))
      (magent-store-append-item-content "s-timer" "item-1" "first ")
      ;; The first chunk after a quiet spell needs the timer.
      (should (timerp (magent-store--session-timer session)))
      (sleep-for 0.06)
      (magent-store-append-item-content "s-timer" "item-1" "second ")
      ;; Past the deadline: that chunk sent the batch and took the timer.
      (should-not (magent-store--session-timer session))
      (should (magent-store--session-inflight session))
      (magent-store-append-item-content "s-timer" "item-1" "third")
      (should-not (magent-store--session-timer session))
      ;; The stream stops; the reply sends the last chunk.
      (let ((deadline (+ (float-time) 5)))
        (while (and (or (magent-store--session-inflight session)
                        (> (magent-store--session-fill session) 0))
                    (< (float-time) deadline))
          (accept-process-output nil 0.05)))
      (should (= (magent-store--session-fill session) 0))
      (should (equal (magent-store-test--content (magent-store-load "s-timer"))
                     "first second third")))))

(provide 'magent-store-alloc-tests)
;;; magent-store-alloc-tests.el ends here
