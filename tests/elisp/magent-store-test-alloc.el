;;; magent-store-test-alloc.el --- Counting what a streamed chunk allocates  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Helpers of the allocation tests (magent-store-alloc-tests.el and
;; upstream/magent-store-alloc-magent-tests.el): byte-compiling what is
;; measured, streaming chunks with ticks and replies, and turning
;; `memory-use-counts' differences into bytes.

;;; Code:

(require 'cl-lib)
(require 'json)
(require 'magent-store-test-backend)
(require 'magent-store)

(defmacro magent-store-test-alloc--with-backend (&rest body)
  "Run BODY with a private root and state dir; stop the backend after."
  (declare (indent 0) (debug t))
  `(magent-store-test-with-backend () ,@body))

(defun magent-store-test-alloc--show (session-id)
  "Return `magent-store show' of global SESSION-ID, parsed."
  (with-temp-buffer
    (call-process (if (listp magent-store-python) (car magent-store-python)
                    magent-store-python)
                  nil '(t nil) nil "show"
                  (expand-file-name (concat "global/" session-id ".json")
                                    magent-store-root))
    (goto-char (point-min))
    (json-parse-buffer :object-type 'alist :null-object nil)))

(defun magent-store-test-alloc--compile ()
  "Byte-compile the shim's functions in memory, as users load them."
  (mapatoms (lambda (symbol)
              (when (and (fboundp symbol)
                         (string-prefix-p "magent-store" (symbol-name symbol))
                         (not (autoloadp (symbol-function symbol)))
                         (not (macrop symbol))
                         (not (byte-code-function-p (symbol-function symbol)))
                         (not (subrp (symbol-function symbol)))
                         (not (advice--p (symbol-function symbol))))
                (let ((byte-compile-warnings nil))
                  (byte-compile symbol))))))

(defun magent-store-test-alloc--bytes (counts)
  "Return the bytes the `memory-use-counts' difference COUNTS stands for."
  (let ((gc (garbage-collect)))
    (cl-loop for n in counts
             for kind in '(conses floats vector-slots symbols string-bytes
                                  intervals strings)
             sum (* n (or (nth 1 (assq kind gc)) 0)))))

(defun magent-store-test-alloc--chunks (n)
  "Return a vector of N distinct chunks, made before anything is counted."
  (let ((chunks (make-vector n nil)))
    (dotimes (i n)
      (aset chunks i (format "chunk %d é 漢字 \"q\" \\ \n" i)))
    chunks))

(defmacro magent-store-test-alloc--counting (&rest body)
  "Run BODY; return the `memory-use-counts' difference it made."
  (declare (indent 0) (debug t))
  `(progn
     (garbage-collect)
     (let ((before (memory-use-counts)))
       ,@body
       (cl-mapcar #'- (memory-use-counts) before))))

(defun magent-store-test-alloc--wait (session)
  "Wait, running no timers, until the backend answered SESSION's batches."
  (let ((process (magent-store-backend-connection magent-store-current-backend)))
    (while (magent-store--session-inflight session)
      (accept-process-output process 0.05 nil 1))))

(defun magent-store-test-alloc--stream (send chunks session)
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
          (magent-store-test-alloc--wait session))))
    (when session
      (magent-store--tick session)
      (magent-store-test-alloc--wait session))))

(provide 'magent-store-test-alloc)
;;; magent-store-test-alloc.el ends here
